"""T5's published layouts as T5 saved them, converted both ways.

Each model is written by Mesh TensorFlow itself from gin text in the style
of T5's published operative configs (scoped bindings, macros, `t5.*`
imports and TPU settings that do not exist here) and saved as T5's trainer
saves it: `operative_config.gin` as gin writes it after building the model,
and a sharded `tf.compat.v1.train.Saver` of every master variable,
Adafactor's slots and `global_step` included. Layouts:

- t5_1_0: the released T5 1.0 checkpoints' legacy LayerStack
  (`LayerStack.dropout_rate` and `norm_epsilon` bound: norms scoped
  `layer_norm` and `final_layer_norm`), ReLU, tied logits;
- t5_1_1: gated GELU, untied logits, `rms_norm` scopes;
- mt5: T5 1.1's layout with heads * d_kv != d_model and a vocabulary
  padded to 128 rows' multiples from an odd size, as mT5's;
- talking_heads: t5.1.th's layout (talking heads in every self- and
  enc-dec attention) with h_k=2, h=3, h_v=4.
"""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

from tests.mtf import model_convert_test as cases
from thattn import models
from thattn.mtf import compat
from thattn.mtf import convert
from thattn.mtf import models as mtf_models

mtf = compat.import_mesh_tensorflow()
TL = "@mesh_tensorflow.transformer.transformer_layers"

# What every T5 operative config starts with; the t5 module is not
# installed here, so thattn drops its import.
_HEADER = """import mesh_tensorflow.optimize
import mesh_tensorflow.transformer.transformer
import mesh_tensorflow.transformer.transformer_layers
import mesh_tensorflow.transformer.utils
import t5.models.mesh_transformer

# Macros:
# ==============================================================================
d_model = 16
MIXTURE_NAME = 'all_mix'
num_layers = 2

AdafactorOptimizer.decay_rate = None
AdafactorOptimizer.factored = True
Bitransformer.shared_embedding = True
run.model_type = 'bitransformer'
run.layout_rules = 'ensemble:ensemble,batch:batch,d_ff:model,heads:model'
run.train_dataset_fn = @t5.models.mesh_transformer.mesh_train_dataset_fn
make_bitransformer.decoder_name = 'decoder'
make_bitransformer.encoder_name = 'encoder'
decoder/EncDecAttention.relative_attention_type = None
"""


def _stacks(template):
  """`template` (with {scope}) once for the encoder and once for the
  decoder, as an operative config lists each binding per scope."""
  return "".join(template.format(scope=scope, TL=TL)
                 for scope in ("encoder", "decoder"))


_STACK_COMMON = """
{scope}/make_layer_stack.block_scope = True
{scope}/make_layer_stack.num_layers = %num_layers
{scope}/Unitransformer.d_model = %d_model
{scope}/Unitransformer.positional_embedding = False
{scope}/Unitransformer.vocab_divisor = 128
{scope}/Unitransformer.z_loss = 0.0001
{scope}/DenseReluDense.dropout_rate = %dropout_rate
{scope}/DenseReluDense.hidden_size = %d_ff
{scope}/DenseReluDense.use_bias = False
"""

_MULTI_HEAD = """
{scope}/SelfAttention.dropout_rate = %dropout_rate
{scope}/SelfAttention.key_value_size = %d_kv
{scope}/SelfAttention.num_heads = %num_heads
{scope}/SelfAttention.relative_attention_num_buckets = 32
{scope}/SelfAttention.relative_attention_type = 'bias_shared'
"""

_LAYERS = f"""
encoder/make_layer_stack.layers = \\
    [{TL}.SelfAttention,
     {TL}.DenseReluDense]
decoder/make_layer_stack.layers = \\
    [{TL}.SelfAttention,
     {TL}.EncDecAttention,
     {TL}.DenseReluDense]
"""

# mtf's sublayers as T5 1.1's operative configs list them.
_SUBLAYERS = """
{scope}/LayerStack.dropout_rate = None
{scope}/LayerStack.norm_epsilon = None
{scope}/LayerStack.sublayers_final = \\
    [@transformer.sublayer_rms_norm, @transformer.sublayer_dropout]
{scope}/LayerStack.sublayers_initial = [@transformer.sublayer_dropout]
{scope}/LayerStack.sublayers_per_layer = \\
    [@transformer.sublayer_rms_norm,
     @transformer.sublayer_call_layer,
     @transformer.sublayer_dropout,
     @transformer.sublayer_residual]
"""

T5_1_0 = _HEADER + """d_ff = 32
d_kv = 4
dropout_rate = 0.1
num_heads = 4
""" + _LAYERS + _stacks(_STACK_COMMON + _MULTI_HEAD + """
{scope}/LayerStack.dropout_rate = %dropout_rate
{scope}/LayerStack.norm_epsilon = 1e-06
{scope}/Unitransformer.shared_embedding_and_softmax_weights = True
""")

_T5_1_1_STACKS = _STACK_COMMON + _SUBLAYERS + """
{scope}/DenseReluDense.activation = ['gelu', 'linear']
{scope}/Unitransformer.shared_embedding_and_softmax_weights = False
"""
_T5_1_1_TAIL = """
sublayer_dropout.dropout_rate = %dropout_rate
sublayer_rms_norm.epsilon = 1e-06
sublayer_rms_norm.name = 'rms_norm'
"""

T5_1_1 = _HEADER + """d_ff = 24
d_kv = 4
dropout_rate = 0.0
num_heads = 4
""" + _LAYERS + _stacks(_T5_1_1_STACKS + _MULTI_HEAD) + _T5_1_1_TAIL

# mT5-small's proportions: heads * d_kv (6 * 64) is not d_model (512).
MT5 = _HEADER + """d_ff = 40
d_kv = 4
dropout_rate = 0.0
num_heads = 3
""" + _LAYERS + _stacks(_T5_1_1_STACKS + _MULTI_HEAD) + _T5_1_1_TAIL

TALKING_HEADS = _HEADER + """d_ff = 24
dropout_rate = 0.0
""" + f"""
encoder/make_layer_stack.layers = \\
    [{TL}.TalkingHeadsSelfAttention,
     {TL}.DenseReluDense]
decoder/make_layer_stack.layers = \\
    [{TL}.TalkingHeadsSelfAttention,
     {TL}.TalkingHeadsEncDecAttention,
     {TL}.DenseReluDense]
TalkingHeadsSelfAttention.key_heads_dims = [('key_heads', 2)]
TalkingHeadsSelfAttention.softmax_heads_dims = [('heads', 3)]
TalkingHeadsSelfAttention.value_heads_dims = [('value_heads', 4)]
TalkingHeadsSelfAttention.key_size = 4
TalkingHeadsSelfAttention.value_size = 6
TalkingHeadsSelfAttention.dropout_rate = %dropout_rate
TalkingHeadsSelfAttention.relative_attention_type = 'bias_shared'
TalkingHeadsSelfAttention.relative_attention_num_buckets = 32
""" + _stacks(_T5_1_1_STACKS) + _T5_1_1_TAIL

LAYOUTS = {"t5_1_0": (T5_1_0, 1024), "t5_1_1": (T5_1_1, 1024),
           "mt5": (MT5, 1100), "talking_heads": (TALKING_HEADS, 1024)}
# The norm scales' names each layout's checkpoint has (and others lack).
NORMS = {
    "legacy": ["encoder/block_000/layer_000/layer_norm/scale",
               "decoder/block_001/layer_002/layer_norm/scale",
               "encoder/final_layer_norm/scale",
               "decoder/final_layer_norm/scale"],
    "rms_norm": ["encoder/block_000/layer_000/rms_norm/scale",
                 "decoder/block_001/layer_002/rms_norm/scale",
                 "encoder/rms_norm/scale", "decoder/rms_norm/scale"]}
_TRAIN = tf.compat.v1.estimator.ModeKeys.TRAIN
_T5_BINDINGS = """import t5.models.mesh_transformer

mesh_train_dataset_fn.mixture_or_task_name = 'all_mix'
mesh_train_dataset_fn.use_cached = True
run.train_dataset_fn = @t5.models.mesh_transformer.mesh_train_dataset_fn
"""


def save_as_t5(folder, gin_text, *, vocab_size, seed=1, step=1000):
  """Builds the model with Mesh TensorFlow and saves it as T5 does.

  mtf's model and Adafactor (its slots made by `apply_grads`) in one graph;
  every master variable, slot and `global_step` saved by a sharded Saver
  with relative paths (mtf's `utils.run`), and `operative_config.gin` as
  gin writes it for the run. Returns the model's {name: float32 array}.
  """
  folder = str(folder)
  tf.io.gfile.makedirs(folder)
  with mtf_models.gin_scope(gin_text), tf.Graph().as_default() as graph:
    tf.compat.v1.set_random_seed(seed)
    tf.compat.v1.train.get_or_create_global_step()
    model = mtf_models.build_model(gin_text=gin_text, vocab_size=vocab_size)
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    ids = mtf_models.ids_to_mtf(mesh, np.ones((1, 4), np.int32))
    logits = mtf_models.call(model, inputs=ids, targets=ids, mode=_TRAIN)
    variables = list(mesh.graph.trainable_variables)
    grads = mtf.gradients([mtf.reduce_mean(logits)],
                          [v.outputs[0] for v in variables])
    # Factored from 16 rather than 128, so that tiny weights get the
    # factored slots (_slot_vr, _slot_vc) a real T5 checkpoint has.
    mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=16).apply_grads(
        grads, variables)
    saver = tf.compat.v1.train.Saver(sharded=True, max_to_keep=None,
                                     save_relative_paths=True)
    operative_config = gin.operative_config_str()
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(tf.compat.v1.assign(
          tf.compat.v1.train.get_global_step(), step))
      saver.save(session, f"{folder}/{mtf_models.CHECKPOINT_PREFIX}",
                 global_step=step, write_meta_graph=False)
  with tf.io.gfile.GFile(f"{folder}/{mtf_models.OPERATIVE_CONFIG}", "w") as f:
    # T5's binaries import the t5 package, so its operative configs also
    # bind t5's configurables, which gin here cannot know.
    f.write(_T5_BINDINGS + operative_config)
  return mtf_models.read_checkpoint(f"{folder}/model.ckpt-{step}")


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def converted(request, tmp_path_factory):
  """Each layout saved as T5 saves it, converted to thattn and back."""
  folder = tmp_path_factory.mktemp(request.param)
  gin_text, vocab_size = LAYOUTS[request.param]
  variables = save_as_t5(folder / "mtf", gin_text, vocab_size=vocab_size)
  convert.mtf_to_thattn(mtf_model_dir=str(folder / "mtf"),
                        model_dir=str(folder / "thattn"), log=lambda _: None)
  convert.thattn_to_mtf(model_dir=str(folder / "thattn"),
                        mtf_model_dir=str(folder / "back"), log=lambda _: None)
  return types.SimpleNamespace(
      name=request.param, folder=folder, variables=variables,
      gin_text=mtf_models.read_operative_config(str(folder / "mtf")),
      vocab_size=vocab_size)


def test_saved_as_t5_saves_it(converted):
  saved = dict(tf.train.list_variables(str(converted.folder / "mtf" /
                                           "model.ckpt-1000")))
  assert "global_step" in saved
  assert any(name.endswith("_slot_vr") for name in saved)  # factored
  assert any(name.endswith("_slot_v") for name in saved)  # not factored
  assert "import t5.models.mesh_transformer" in converted.gin_text
  layout = "legacy" if converted.name == "t5_1_0" else "rms_norm"
  for name in NORMS[layout]:
    assert name in converted.variables, name
  other, = set(NORMS) - {layout}
  assert not set(NORMS[other]) & set(converted.variables)
  assert (converted.name == "t5_1_0") == ("decoder/logits/kernel" not in
                                          converted.variables)


def test_thattn_logits_equal_mtfs(converted):
  inputs, targets = cases._tokens(0)  # pylint: disable=protected-access
  expected = mtf_models.logits(
      gin_text=converted.gin_text, vocab_size=converted.vocab_size,
      variables=converted.variables, inputs=inputs, targets=targets)
  model = models.load(str(converted.folder / "thattn"))
  got = cases._thattn_logits(model, inputs, targets)  # pylint: disable=protected-access
  difference = cases._assert_logits_equal(expected, got, targets)  # pylint: disable=protected-access
  print(f"{converted.name}: max |thattn - mtf| logits {difference:.1e}")


def test_converted_back_has_the_source_names_values_and_logits(converted):
  back = str(converted.folder / "back")
  values = mtf_models.read_checkpoint(mtf_models.latest_checkpoint(back))
  assert sorted(values) == sorted(converted.variables)
  for name, value in converted.variables.items():
    assert np.array_equal(values[name], value), name
  inputs, targets = cases._tokens(1)  # pylint: disable=protected-access
  source = mtf_models.logits(
      gin_text=converted.gin_text, vocab_size=converted.vocab_size,
      variables=converted.variables, inputs=inputs, targets=targets)
  # The written model_dir as mtf reads it: its own gin, its own checkpoint.
  again = mtf_models.logits(
      gin_text=mtf_models.read_operative_config(back),
      vocab_size=values["shared/embedding"].shape[0], variables=values,
      inputs=inputs, targets=targets)
  difference = cases._assert_logits_equal(source, again, targets, atol=1e-6)  # pylint: disable=protected-access
  print(f"{converted.name}: max |back - source| mtf logits {difference:.1e}")


def test_a_legacy_stack_with_a_layer_thattn_lacks_is_refused(tmp_path):
  save_as_t5(tmp_path / "mtf", T5_1_0, vocab_size=1024)
  # The architecture is refused before any variable is looked at.
  config = tmp_path / "mtf" / mtf_models.OPERATIVE_CONFIG
  gin_text = config.read_text().replace(
      ".SelfAttention,\n", ".LocalSelfAttention,\n")
  assert "LocalSelfAttention" in gin_text
  config.write_text(gin_text)
  before = sorted(p.name for p in (tmp_path / "mtf").iterdir())
  (tmp_path / "out").mkdir()
  with pytest.raises(ValueError, match=r"encoder/make_layer_stack\.layers: "
                     r"layer 'block_000/layer_000' is a LocalSelfAttention"):
    convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "mtf"),
                          model_dir=str(tmp_path / "out"), log=lambda _: None)
  assert not list((tmp_path / "out").iterdir())
  assert sorted(p.name for p in (tmp_path / "mtf").iterdir()) == before
