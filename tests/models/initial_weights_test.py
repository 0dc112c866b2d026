"""thattn.models.initial_weights: every weight of thattn's tf_keras models
and heads is drawn from the initializer its layer keeps, by name.

The draws are checked against the models' own initializers: a weight drawn
from the seed has the stddev (constants: the values) that tf_keras's draw
of the same layer has, so the walk read the right initializer for each.
The Keras 3 models' draws are checked equal to these in
tests/keras3/models_checks.py (models_test.py).
"""

import importlib
import pathlib

import numpy as np
import pytest
import tf_keras

from thattn import models
from thattn.models import heads
from thattn.models import initial_weights

_EXAMPLES = str(pathlib.Path(__file__).resolve().parents[2] / "docs" /
                "examples")
CASES = [("bert_tiny", attention) for attention in
         ("multi_head", "talking_heads", "project_logits", "project_weights",
          "dynamic", "general_bilinear")] + [
              ("albert_tiny", "talking_heads"), ("t5_tiny", "multi_head"),
              ("t5_tiny", "talking_heads")]


def _compare_with_own_draw(layers, seed):
  own = {w.name: w.numpy() for layer in layers for w in layer.weights}
  count = initial_weights.assign(layers, seed)
  assert count == len(own)
  for layer in layers:
    for weight in layer.weights:
      drawn, before = weight.numpy(), own[weight.name]
      if before.std() == 0:  # zeros, ones
        np.testing.assert_array_equal(drawn, before, err_msg=weight.name)
      else:
        assert not np.array_equal(drawn, before), weight.name
        if before.size >= 256:
          ratio = drawn.std() / before.std()
          assert 0.85 < ratio < 1.15, (weight.name, ratio)


@pytest.mark.parametrize("preset,attention", CASES)
def test_the_drawn_weights_follow_each_layer_s_initializer(preset, attention):
  model = models.create_model(preset, attention=attention)
  _compare_with_own_draw([model], seed=5)


def test_the_task_heads_are_drawn_too():
  backbone = models.create_model("bert_tiny")
  head = heads.MaskedLMHead(backbone.get_layer("word_embeddings"),
                            name="masked_lm")
  head(backbone.output["sequence_output"],
       tf_keras.Input([None], dtype="int32"))
  # The head's table is the backbone's: drawn once.
  pairs = initial_weights.initializers_of([backbone, head])
  assert len(pairs) == len({id(w) for layer in (backbone, head)
                            for w in layer.weights})
  _compare_with_own_draw([backbone, head], seed=5)
  classifier = heads.ClassificationHead(3, name="classifier")
  classifier(backbone.output["pooled_output"])
  _compare_with_own_draw([classifier], seed=5)


def test_a_variant_registered_outside_the_package_is_drawn(monkeypatch):
  monkeypatch.syspath_prepend(_EXAMPLES)
  importlib.import_module("custom_variant")  # registers it
  model = models.create_model("bert_tiny", attention="residual_talking_heads")
  names = [w.name for w, _ in initial_weights.initializers_of([model])]
  assert any("logits_residual" in name for name in names)
  _compare_with_own_draw([model], seed=5)


def test_the_draw_depends_on_the_seed():
  first, second = (models.create_model("bert_tiny") for _ in range(2))
  initial_weights.assign([first], seed=1)
  initial_weights.assign([second], seed=1)
  for a, b in zip(first.weights, second.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  initial_weights.assign([second], seed=2)
  kernel = [i for i, w in enumerate(first.weights) if "kernel" in w.name][0]
  assert not np.array_equal(first.weights[kernel].numpy(),
                            second.weights[kernel].numpy())


def test_a_weight_without_a_known_initializer_is_named():

  class Scale(tf_keras.layers.Layer):

    def build(self, input_shape):
      self.factor = self.add_weight("factor", [input_shape[-1]],
                                    initializer="ones")

    def call(self, inputs):
      return inputs * self.factor

  inputs = tf_keras.Input([4])
  model = tf_keras.Model(inputs, Scale(name="scale")(inputs))
  with pytest.raises(ValueError, match=r"weights scale/factor:0.*"
                     r"`<weight>_initializer`"):
    initial_weights.assign([model], seed=0)
