"""thattn.mtf.models: whole mtf models from gin, run, saved and read back.

The tiny T5-style models (d_model 16, 2 heads of 8, d_ff 32, 2 layers per
stack, vocabulary 100 padded to 128) build in a fraction of a second. The
2-device mesh runs in a fresh Python (this file as a script), because
logical CPUs must be made before TensorFlow initializes its devices.
"""

import json
import os
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

from tests import forkserver
from thattn.mtf import layout
from thattn.mtf import models

VOCAB = 100
# The T5 bitransformer layout: relative bias shared by each stack's layers,
# tied embeddings, pre-norm residual layer stacks (mtf's defaults.gin).
BI_GIN = """
import mesh_tensorflow.transformer.transformer_layers
Unitransformer.d_model = 16
Unitransformer.positional_embedding = False
Unitransformer.shared_embedding_and_softmax_weights = True
Bitransformer.shared_embedding = True
encoder/make_layer_stack.num_layers = 2
decoder/make_layer_stack.num_layers = 2
encoder/make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                   @transformer_layers.DenseReluDense]
decoder/make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                   @transformer_layers.EncDecAttention,
                                   @transformer_layers.DenseReluDense]
SelfAttention.num_heads = 2
SelfAttention.key_value_size = 8
SelfAttention.relative_attention_type = "bias_shared"
DenseReluDense.hidden_size = 32
"""
# T5.1.1-style language model: GEGLU feed-forward, untied softmax.
LM_GIN = """
utils.run.model_type = "lm"
Unitransformer.d_model = 16
Unitransformer.positional_embedding = False
Unitransformer.shared_embedding_and_softmax_weights = False
make_layer_stack.num_layers = 2
make_layer_stack.layers = [@transformer_layers.SelfAttention,
                           @transformer_layers.DenseReluDense]
SelfAttention.num_heads = 2
SelfAttention.key_value_size = 8
SelfAttention.relative_attention_type = "bias_shared"
DenseReluDense.hidden_size = 32
DenseReluDense.activation = ["gelu", "linear"]
"""
# Hand-written as T5's talking-heads configs are: module-qualified
# references, scoped layer stacks and macros (`dropout_rate` comes from
# mtf's defaults.gin), and lines only T5 could honour.
TH_GIN = """
import t5.models.mesh_transformer
include_t5_mixture.name = 'c4_v020_unsupervised'
run.train_dataset_fn = @t5.models.mesh_transformer.mesh_train_dataset_fn
utils.run.model_type = %model_kind
model_kind = "bitransformer"
d_model = 16
num_layers = 1
d_ff = 32
Unitransformer.d_model = %d_model
transformer.make_layer_stack.num_layers = %num_layers
DenseReluDense.hidden_size = %d_ff
Unitransformer.positional_embedding = False
encoder/transformer.make_layer_stack.layers = [
    @mesh_tensorflow.transformer.transformer_layers.TalkingHeadsSelfAttention,
    @mesh_tensorflow.transformer.transformer_layers.DenseReluDense,
]
decoder/transformer.make_layer_stack.layers = [
    @mesh_tensorflow.transformer.transformer_layers.TalkingHeadsSelfAttention,
    @mesh_tensorflow.transformer.transformer_layers.TalkingHeadsEncDecAttention,
    @thattn.GroupedTalkingHeadsSelfAttention,
    @mesh_tensorflow.transformer.transformer_layers.DenseReluDense,
]
heads = 4
TalkingHeadsSelfAttention.key_heads_dims = [("key_heads", 3)]
TalkingHeadsSelfAttention.softmax_heads_dims = [("heads", %heads)]
TalkingHeadsSelfAttention.value_heads_dims = [("value_heads", 5)]
TalkingHeadsSelfAttention.key_size = 8
TalkingHeadsSelfAttention.value_size = 8
TalkingHeadsSelfAttention.dropout_rate = %dropout_rate
TalkingHeadsSelfAttention.relative_attention_type = "bias_shared"
thattn.GroupedTalkingHeadsSelfAttention.num_heads = 4
thattn.GroupedTalkingHeadsSelfAttention.num_head_groups = 2
thattn.GroupedTalkingHeadsSelfAttention.key_dim = 4
"""
IDS = np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]], np.int32)
MESH_TOLERANCE = 1e-5  # relative to the largest |logit|; float32 rounding


def _run_mesh_script():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(sys.path))
  return forkserver.Popen([sys.executable, os.path.abspath(__file__)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)


@pytest.fixture(scope="module", autouse=True)
def mesh_process():
  """The 2-device run, started first so it overlaps the other tests."""
  process = _run_mesh_script()
  yield process
  if process.poll() is None:
    process.kill()
  process.communicate()


@pytest.fixture(scope="module")
def initial():
  return models.initial_variables(gin_text=BI_GIN, vocab_size=VOCAB, seed=1)


@pytest.fixture(scope="module")
def reference(initial):
  return models.logits(gin_text=BI_GIN, vocab_size=VOCAB, variables=initial,
                       inputs=IDS, targets=IDS)


def test_variables_have_the_names_and_shapes_of_t5_checkpoints():
  shapes = models.variable_shapes(gin_text=BI_GIN, vocab_size=VOCAB)
  block = "encoder/block_000/"
  assert shapes["shared/embedding"] == (128, 16)
  assert shapes[block + "layer_000/SelfAttention/q"] == (16, 2 * 8)
  assert shapes[block + "layer_000/SelfAttention/o"] == (2 * 8, 16)
  assert shapes[block + "layer_000/rms_norm/scale"] == (16,)
  assert shapes[block + "layer_001/DenseReluDense/wi/kernel"] == (16, 32)
  assert shapes["encoder/rms_norm/scale"] == (16,)
  # "bias_shared": one [heads, buckets] bias per stack, in its first layer.
  bias = [name for name in shapes if "relative_attention_bias" in name]
  assert sorted(bias) == [
      "decoder/block_000/layer_000/SelfAttention/relative_attention_bias",
      block + "layer_000/SelfAttention/relative_attention_bias"]
  assert shapes["decoder/block_001/layer_001/EncDecAttention/k"] == (16, 16)
  assert "decoder/logits/kernel" not in shapes  # tied to the embedding
  # Per block 4 + 2 kernels and 2 norms (decoder: 4 + 4 + 2 and 3); each
  # stack a bias and a final norm; the shared embedding.
  assert len(shapes) == 1 + (2 * 8 + 2) + (2 * 13 + 2)


def test_initial_variables_are_mtf_initializers_under_the_seed(initial):
  shapes = models.variable_shapes(gin_text=BI_GIN, vocab_size=VOCAB)
  assert {k: v.shape for k, v in initial.items()} == shapes
  assert all(v.dtype == np.float32 for v in initial.values())
  assert np.all(initial["encoder/rms_norm/scale"] == 1.0)
  again = models.initial_variables(gin_text=BI_GIN, vocab_size=VOCAB, seed=1)
  assert all(np.array_equal(again[k], v) for k, v in initial.items())


def test_a_model_dir_round_trips_bit_exactly(tmp_path, initial):
  directory = str(tmp_path / "mtf")
  models.write_model_dir(mtf_model_dir=directory, gin_text=BI_GIN,
                         variables=initial, step=10)
  prefix = models.latest_checkpoint(directory)
  assert prefix == os.path.join(directory, "model.ckpt-10")
  read = models.read_checkpoint(prefix)
  assert sorted(read) == sorted(initial)
  for name, value in initial.items():
    assert read[name].dtype == np.float32
    assert read[name].tobytes() == value.tobytes(), name
  assert models.read_operative_config(directory) == BI_GIN
  reader = tf.train.load_checkpoint(prefix)
  assert reader.get_variable_to_dtype_map()["global_step"] == tf.int64
  assert reader.get_tensor("global_step") == 10


def test_latest_checkpoint_finds_each_step(tmp_path):
  directory = str(tmp_path)
  values = {"encoder/rms_norm/scale": np.ones(16, np.float32)}
  for step in (20, 5):
    models.write_model_dir(mtf_model_dir=directory, gin_text=BI_GIN,
                           variables=values, step=step)
  # The state file names the last one written, as TF's Saver does.
  assert models.latest_checkpoint(directory).endswith("model.ckpt-5")
  assert models.latest_checkpoint(directory, step=20).endswith("-20")
  os.remove(os.path.join(directory, "checkpoint"))
  assert models.latest_checkpoint(directory).endswith("model.ckpt-20")
  with pytest.raises(ValueError, match=r"step 7.*steps \[5, 20\]"):
    models.latest_checkpoint(directory, step=7)
  with pytest.raises(ValueError, match=r"any checkpoint.*steps \[\]"):
    models.latest_checkpoint(str(tmp_path / "empty"))


def test_read_checkpoint_skips_slots_and_casts_bfloat16(tmp_path):
  values = {"a/kernel": ([[1.5, -2.0]], tf.bfloat16),
            "a/kernel_slot_vr": ([1.0], tf.float32),
            "global_step": (3, tf.int64)}
  prefix = str(tmp_path / "model.ckpt-3")
  # A TF1 name-based checkpoint, as mtf's Saver writes (bfloat16 masters).
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    saved = {k: tf.compat.v1.Variable(value, dtype=dtype, name=f"v{i}")
             for i, (k, (value, dtype)) in enumerate(values.items())}
    session.run(tf.compat.v1.global_variables_initializer())
    tf.compat.v1.train.Saver(saved).save(session, prefix,
                                         write_meta_graph=False)
  read = models.read_checkpoint(prefix)
  assert list(read) == ["a/kernel"]
  assert read["a/kernel"].dtype == np.float32
  np.testing.assert_array_equal(read["a/kernel"], [[1.5, -2.0]])


def test_logits_depend_on_the_variables(initial, reference):
  assert reference.shape == (2, 5, 128) and reference.dtype == np.float32
  assert np.all(np.isfinite(reference))
  changed = dict(initial)
  name = "decoder/block_001/layer_002/DenseReluDense/wo/kernel"
  changed[name] = initial[name] * 2.0
  other = models.logits(gin_text=BI_GIN, vocab_size=VOCAB, variables=changed,
                        inputs=IDS, targets=IDS)
  assert np.max(np.abs(other - reference)) > 1e-3


def test_a_language_model_is_a_causal_unitransformer():
  assert models.model_type(LM_GIN) == "lm"
  shapes = models.variable_shapes(gin_text=LM_GIN, vocab_size=VOCAB)
  ff = "transformer/block_000/layer_001/DenseReluDense/"
  assert shapes[ff + "wi_0/kernel"] == shapes[ff + "wi_1/kernel"] == (16, 32)
  assert shapes["transformer/embedding"] == (128, 16)
  assert shapes["transformer/logits/kernel"] == (16, 128)
  values = models.initial_variables(gin_text=LM_GIN, vocab_size=VOCAB, seed=2)
  targets = IDS.copy()
  first = models.logits(gin_text=LM_GIN, vocab_size=VOCAB, variables=values,
                        targets=targets)
  targets[:, 2] = 50
  second = models.logits(gin_text=LM_GIN, vocab_size=VOCAB, variables=values,
                         targets=targets)
  # Inputs are the targets shifted right: position 2's target is read from
  # position 3 on.
  np.testing.assert_array_equal(first[:, :3], second[:, :3])
  assert np.max(np.abs(first[:, 3:] - second[:, 3:])) > 1e-4
  with pytest.raises(ValueError, match="inputs=None"):
    models.logits(gin_text=LM_GIN, vocab_size=VOCAB, variables=values,
                  inputs=IDS, targets=IDS)


def test_a_hand_written_t5_style_config_with_unknown_lines_builds():
  assert models.model_type(TH_GIN) == "bitransformer"
  shapes = models.variable_shapes(gin_text=TH_GIN, vocab_size=VOCAB)
  th = "encoder/block_000/layer_000/TalkingHeadsSelfAttention/"
  assert shapes[th + "q/kernel"] == (16, 3, 8)
  assert shapes[th + "logits/kernel"] == (3, 4)
  assert shapes[th + "weights/kernel"] == (4, 5)
  assert shapes[th + "relative_attention_bias"] == (4, 32)
  # TalkingHeadsSelfAttention's bindings configure its enc-dec subclass.
  enc_dec = "decoder/block_000/layer_001/TalkingHeadsEncDecAttention/"
  assert shapes[enc_dec + "y/kernel"] == (5, 8, 16)
  grouped = "decoder/block_000/layer_002/GroupedTalkingHeadsSelfAttention/"
  assert shapes[grouped + "logits/kernel"] == (2, 2, 2)
  # Tied: Unitransformer's own default is untied, mtf's defaults.gin ties.
  assert "decoder/logits/kernel" not in shapes


def test_an_operative_config_gives_the_same_logits_bit_for_bit(initial,
                                                                reference):
  """gin's own operative config rebuilds the model; logits are deterministic."""
  with models.gin_scope(BI_GIN):
    # The same text nests without re-parsing, so gin records what ran.
    shapes = models.variable_shapes(gin_text=BI_GIN, vocab_size=VOCAB)
    operative = gin.operative_config_str()
  assert "SelfAttention.num_heads = 2" in operative
  assert models.variable_shapes(gin_text=operative,
                                vocab_size=VOCAB) == shapes
  np.testing.assert_array_equal(reference, models.logits(
      gin_text=operative, vocab_size=VOCAB, variables=initial, inputs=IDS,
      targets=IDS))


def test_gin_scope_clears_and_restores_gin():
  with models.gin_scope(LM_GIN):
    assert gin.query_parameter("SelfAttention.num_heads") == 2
    assert models.model_type(BI_GIN) == "bitransformer"
    assert gin.query_parameter("utils.run.model_type") == "lm"
    with pytest.raises(ValueError):
      with models.gin_scope("SelfAttention.num_heads = 3"):
        raise ValueError("inside")
    assert gin.query_parameter("SelfAttention.num_heads") == 2
  with pytest.raises(ValueError, match="'SelfAttention' has no bound"):
    gin.query_parameter("SelfAttention.num_heads")


def test_bound_value_evaluates_macros_over_mtf_defaults():
  with models.gin_scope(TH_GIN):
    # mtf's defaults.gin: `sublayer_dropout.dropout_rate = %dropout_rate`.
    assert models.bound_value("sublayer_dropout.dropout_rate") == 0.1
    # References to configurables stay references.
    assert [str(reference) for reference in models.bound_value(
        "LayerStack.sublayers_initial")] == ["@transformer.sublayer_dropout"]
    assert models.bound_value(
        "TalkingHeadsSelfAttention.softmax_heads_dims") == [("heads", 4)]
    assert models.bound_value("utils.run.model_type") == "bitransformer"
    assert models.bound_value("DenseReluDense.activation", "relu") == "relu"


def test_a_gin_syntax_error_names_the_line():
  with pytest.raises(ValueError, match=r"line 3: 'SelfAttention.num_heads 2'"):
    models.model_type("a = 1\n\nSelfAttention.num_heads 2\n")
  with pytest.raises(ValueError, match="no_such_parameter"):
    models.model_type("SelfAttention.no_such_parameter = 1")


def test_bad_inputs_are_value_errors_naming_them(tmp_path, initial):
  with pytest.raises(ValueError, match="operative_config.gin does not exist"):
    models.read_operative_config(str(tmp_path))
  with pytest.raises(ValueError, match=r"model_type 'encoder_only'"):
    models.variable_shapes(gin_text=BI_GIN, vocab_size=VOCAB,
                           model_type="encoder_only")
  missing = dict(initial)
  del missing["encoder/rms_norm/scale"]
  with pytest.raises(ValueError, match=r"missing \['encoder/rms_norm/scale'"):
    models.logits(gin_text=BI_GIN, vocab_size=VOCAB, variables=missing,
                  inputs=IDS, targets=IDS)
  misshapen = dict(initial, **{"shared/embedding": np.zeros((100, 16))})
  with pytest.raises(ValueError, match=r"shared/embedding.*\(100, 16\).*"
                     r"\(128, 16\)"):
    models.logits(gin_text=BI_GIN, vocab_size=VOCAB, variables=misshapen,
                  inputs=IDS, targets=IDS)
  with pytest.raises(ValueError, match="rules 'heads:model' need a mesh"):
    models.logits(gin_text=BI_GIN, vocab_size=VOCAB, variables=initial,
                  inputs=IDS, targets=IDS, rules="heads:model")
  with pytest.raises(ValueError, match=r"targets ids must be in \[0, 100\)"):
    models.logits(gin_text=BI_GIN, vocab_size=VOCAB, variables=initial,
                  inputs=IDS, targets=IDS + 99)


def test_a_truncated_checkpoint_is_a_value_error_naming_it(tmp_path, initial):
  directory = str(tmp_path)
  models.write_model_dir(mtf_model_dir=directory, gin_text=BI_GIN,
                         variables=initial, step=1)
  prefix = models.latest_checkpoint(directory)
  data = prefix + ".data-00000-of-00001"
  with open(data, "r+b") as f:
    f.truncate(os.path.getsize(data) // 2)
  with pytest.raises(ValueError, match="model.ckpt-1"):
    models.read_checkpoint(prefix)
  with pytest.raises(ValueError, match="model.ckpt-2"):
    models.read_checkpoint(os.path.join(directory, "model.ckpt-2"))


def test_a_two_device_mesh_gives_the_one_device_logits(mesh_process):
  out, err = mesh_process.communicate(timeout=300)
  assert mesh_process.returncode == 0, err[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  assert result["devices"] == 2
  assert result["relative_error"] <= MESH_TOLERANCE, result


def _mesh_main():
  """Prints the 2-device logits' difference from the 1-device ones."""
  layout.configure_logical_cpus(2)
  values = models.initial_variables(gin_text=BI_GIN, vocab_size=VOCAB, seed=1)
  args = dict(gin_text=BI_GIN, vocab_size=VOCAB, variables=values,
              inputs=IDS, targets=IDS)
  one = models.logits(**args)
  two = models.logits(mesh="model:2", rules="heads:model", **args)
  error = float(np.max(np.abs(two - one)) / np.max(np.abs(one)))
  print(json.dumps({"devices": len(tf.config.list_logical_devices("CPU")),
                    "relative_error": error}))


if __name__ == "__main__":
  _mesh_main()
