"""Whole Mesh TensorFlow models from gin configs, run on a mesh, and saved.

An mtf model_dir (as T5's public checkpoints) holds its run's gin config,
`operative_config.gin`, and TF1 name-based checkpoints `model.ckpt-N`:

    text = models.read_operative_config(mtf_model_dir)
    values = models.read_checkpoint(models.latest_checkpoint(mtf_model_dir))
    y = models.logits(gin_text=text, vocab_size=32100, variables=values,
                      inputs=ids, targets=ids)

The models are mtf's own `Bitransformer` and `Unitransformer`, built as
`mesh_tensorflow.transformer.utils.build_model` builds them inside
`gin_scope`, which parses the gin text over mtf's `defaults.gin` as every
mtf and T5 run does (`utils.parse_gin_defaults_and_flags`). mtf's layers
read some bindings when *called*, so whatever calls a model runs in the
same scope. `logits` feeds a model as mtf's training and eval do, in EVAL
mode and float32, on `PlacementMeshImpl` (one device, or logical CPUs with
thattn's rules).
"""
# The interface's `model_type` keyword shadows the function of that name.
# pylint: disable=redefined-outer-name

import contextlib
import importlib
import os
import re
import tokenize

import gin
import numpy as np
import tensorflow as tf

from thattn.mtf import compat
from thattn.mtf import layers  # pylint: disable=unused-import
from thattn.mtf import layout as layout_lib
from thattn.mtf import trusted_gin

compat.install_transformer()
mtf = compat.import_mesh_tensorflow()
# After the compat patches. They register every mtf configurable a model
# binds, and `utils.run`, whose model_type names the model.
transformer = importlib.import_module("mesh_tensorflow.transformer.transformer")
importlib.import_module("mesh_tensorflow.transformer.transformer_layers")
importlib.import_module("mesh_tensorflow.transformer.utils")

OPERATIVE_CONFIG = "operative_config.gin"
# Checkpoint entries under this scope are thattn's trainer state (the
# held-out loss before training), not model variables.
TRAINER_SCOPE = "thattn/"
CHECKPOINT_PREFIX = "model.ckpt"
BITRANSFORMER = "bitransformer"
MODEL_TYPES = (BITRANSFORMER, "lm", "delimited_lm", "aligned")
MTF_DEFAULTS = os.path.join(os.path.dirname(transformer.__file__), "gin",
                            "defaults.gin")

_EVAL = tf.compat.v1.estimator.ModeKeys.EVAL
_LANGUAGE_MODELS = ("lm", "delimited_lm")  # autoregressive Unitransformers
_PARSE_ERRORS = (SyntaxError, tokenize.TokenError, ValueError, TypeError,
                 KeyError, AttributeError, ImportError, OSError)
_CHECKPOINT = re.compile(re.escape(CHECKPOINT_PREFIX) + r"-(\d+)")
# The gin texts of the gin_scopes entered and not yet left, innermost last.
_SCOPES = []


def read_operative_config(mtf_model_dir):
  """The text of DIR/operative_config.gin; ValueError naming it if missing."""
  path = os.path.join(mtf_model_dir, OPERATIVE_CONFIG)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"{path} does not exist: an mtf model_dir holds the "
                     f"gin config of its run as {OPERATIVE_CONFIG}.")
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as error:
    raise ValueError(f"{path} is not a text file ({error}); expected the gin "
                     "config of an mtf run.") from None
  if not text.strip():
    raise ValueError(f"{path} is empty; expected the gin config of an mtf "
                     "run (its model's bindings).")
  return text


def _parse(gin_text):
  """Clears gin and parses mtf's defaults.gin, then `gin_text`."""
  gin.clear_config()
  gin.parse_config_file(MTF_DEFAULTS, skip_unknown=True)
  try:
    # A real T5 operative config binds t5, dataset and TPU configurables
    # that do not exist here; the architecture bindings are all mtf's.
    gin.parse_config(trusted_gin.trusted_text(gin_text),
                     skip_unknown=True)
  except _PARSE_ERRORS as error:
    gin.clear_config()
    where = (f" at line {error.lineno}: {error.text.strip()!r}" if
             isinstance(error, SyntaxError) and error.text else "")
    raise ValueError(f"cannot parse the gin config{where}: "
                     f"{type(error).__name__}: {error}") from error


@contextlib.contextmanager
def gin_scope(gin_text):
  """Makes `gin_text` gin's whole config for the duration of the block.

  Clears gin's config, parses mtf's defaults.gin and then `gin_text` (an
  operative_config.gin, or a hand-written config without `include`s) with
  mtf's transformer and thattn's mtf layers registered, yields, and clears
  gin again on exit (also on error). Only `mesh_tensorflow` modules named
  in `import` lines are imported; the other import lines (e.g. `import
  t5.models.mesh_transformer`) are dropped, named in a warning, and
  `include` lines refused (`thattn.mtf.trusted_gin`); bindings of unknown
  configurables are skipped. Scopes nest: leaving an inner
  scope restores the outer one's config.

  Raises:
    ValueError naming the offending line when gin cannot parse `gin_text`.
  """
  reuse = bool(_SCOPES) and _SCOPES[-1] == gin_text  # nothing to (re)parse
  try:
    if not reuse:
      _parse(gin_text)
    _SCOPES.append(gin_text)
    try:
      yield
    finally:
      _SCOPES.pop()
  finally:
    if not reuse:
      gin.clear_config()
      if _SCOPES:
        _parse(_SCOPES[-1])  # the outer scope's config, as it was


def _evaluated(value):
  """`value` with every gin macro (`%name`) in it replaced by its value."""
  if isinstance(value, (list, tuple)):
    return type(value)(_evaluated(item) for item in value)
  if isinstance(value, dict):
    return {key: _evaluated(item) for key, item in value.items()}
  if (isinstance(value, gin.config.ConfigurableReference) and
      value.configurable.selector == "gin.macro"):
    return _evaluated(value.scoped_configurable_fn())
  return value


def bound_value(name, default=None):
  """What the current gin config binds to `name`, with macros evaluated.

  Use inside `gin_scope`. `name` is "[scope/]configurable.parameter", e.g.
  "sublayer_dropout.dropout_rate" (`%dropout_rate` in T5's configs and
  mtf's defaults.gin). References to configurables (`@x`) stay references.
  Returns `default` when nothing binds `name`.
  """
  try:
    return _evaluated(gin.query_parameter(name))
  except ValueError:
    return default


def _bound_model_type():
  return bound_value("utils.run.model_type", BITRANSFORMER)


def model_type(gin_text):
  """`utils.run.model_type` (or `run.model_type`) of `gin_text`.

  "bitransformer" when unbound. mtf's `utils.run` is registered here,
  although it cannot run on TF 2.21.
  """
  with gin_scope(gin_text):
    return _bound_model_type()


def build_model(*, gin_text, vocab_size, model_type=None, mesh_shape=None,
                layout=None):
  """The mtf model as `mesh_tensorflow.transformer.utils.build_model` makes it.

  Args:
    gin_text: the gin config.
    vocab_size: the input and output vocabulary size (mtf pads it to a
      multiple of `Unitransformer.vocab_divisor`, 128 by default).
    model_type: "bitransformer", "lm", "delimited_lm" or "aligned"; None
      reads `utils.run.model_type` from `gin_text`.
    mesh_shape, layout: a thattn MeshSpec and LayoutRules (or strings), or
      None; mtf's MoE layers read them.

  Returns:
    A `Bitransformer` or `Unitransformer`. Call it inside
    `gin_scope(gin_text)`: mtf reads some bindings at call time.

  Raises:
    ValueError naming an unsupported model type.
  """
  with gin_scope(gin_text):
    kind = model_type or _bound_model_type()
    if kind not in MODEL_TYPES:
      raise ValueError(f"unsupported mtf model_type {kind!r}; expected one "
                       f"of {', '.join(MODEL_TYPES)}.")
    common = dict(
        input_vocab_size=vocab_size, output_vocab_size=vocab_size,
        mesh_shape=(None if mesh_shape is None else
                    layout_lib.mtf_mesh_shape(mesh_shape)),
        layout=None if layout is None else layout_lib.mtf_layout(layout))
    if kind == BITRANSFORMER:
      return transformer.make_bitransformer(**common)
    return transformer.Unitransformer(
        autoregressive=kind in _LANGUAGE_MODELS,
        layer_stack=transformer.make_layer_stack(), **common)


def _ids(name, value, vocab_size):
  """`value` checked as int32 [batch, length] ids below `vocab_size`."""
  ids = np.asarray(value)
  if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"{name} must be integer ids [batch, length], got "
                     f"dtype {ids.dtype} shape {ids.shape}.")
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"{name} ids must be in [0, {vocab_size}), got "
                     f"[{ids.min()}, {ids.max()}].")
  return ids.astype(np.int32)


def ids_to_mtf(mesh, ids):
  """int32 ids [batch, length] (an array or a tf.Tensor) as an mtf tensor."""
  dims = [mtf.Dimension("batch", ids.shape[0]),
          mtf.Dimension("length", ids.shape[1])]
  return mtf.import_tf_tensor(mesh, tf.convert_to_tensor(ids, tf.int32),
                              mtf.Shape(dims))


def kind_of(model):
  """The model type of a built mtf model: "bitransformer", "lm" or
  "aligned" (a "delimited_lm" is fed as an "lm")."""
  if isinstance(model, transformer.Bitransformer):
    return BITRANSFORMER
  return "lm" if model.autoregressive else "aligned"


def call(model, *, inputs, targets, mode):
  """The model's float32 logits, fed as mtf's training and eval feed it.

  inputs, targets: mtf int32 [batch, length] tensors (`ids_to_mtf`);
  inputs are ignored by the language models. Call inside `gin_scope`.
  """
  kind = kind_of(model)
  # A Bitransformer shifts the targets itself and takes min(ids, 1) as
  # sequence ids (0 is padding); the language models read the shifted
  # targets, without sequence ids, as mtf's model_fn gives them (causal
  # attention keeps padding at the end from reaching the tokens before).
  if kind == "lm":
    inputs = transformer.autoregressive_inputs(targets)
  # An aligned model is told where the padding is (0), as a Bitransformer
  # tells its encoder; mtf's own feeding masks nothing without segment ids.
  sequence_id = ({"sequence_id": mtf.minimum(inputs, 1)}
                 if kind == "aligned" else {})
  if kind == "lm" and model.input_full_attention:
    # A prefix LM, told where its targets' padding is: the padding after
    # the second end token counts as a prefix by mtf's end-token parity
    # (`delimited_lm_inputs_mask`), and would be seen by the prefix.
    sequence_id = {"sequence_id": mtf.minimum(targets, 1)}
  logits, _ = model.call_simple(
      inputs=inputs, targets=targets, compute_loss=False, mode=mode,
      variable_dtype=mtf.VariableDType(tf.float32), **sequence_id)
  return logits


def _check_inputs(kind, inputs, targets, vocab_size):
  """(inputs, targets) as int32 arrays; inputs None for the language models."""
  targets = _ids("targets", targets, vocab_size)
  if kind in _LANGUAGE_MODELS:
    if inputs is not None:
      raise ValueError(f"a {kind!r} model reads the targets shifted right; "
                       "got inputs, expected inputs=None.")
    return None, targets
  if inputs is None:
    raise ValueError(f"a {kind!r} model needs inputs, got None.")
  inputs = _ids("inputs", inputs, vocab_size)
  if kind == "aligned" and inputs.shape != targets.shape:
    raise ValueError(f"an 'aligned' model needs inputs shaped as targets "
                     f"{targets.shape}, got {inputs.shape}.")
  return inputs, targets


def _build(*, gin_text, vocab_size, kind, inputs=None, targets=None,
           mesh=None, rules=None):
  """(mtf mesh, logits, trainable variables) in the default tf.Graph.

  Without targets: on ids [1, 2], enough to make every variable."""
  kind = kind or _bound_model_type()
  model = build_model(gin_text=gin_text, vocab_size=vocab_size,
                      model_type=kind, mesh_shape=mesh, layout=rules)
  if targets is None:
    targets = np.ones((1, 2), np.int32)
    inputs = None if kind in _LANGUAGE_MODELS else targets
  inputs, targets = _check_inputs(kind, inputs, targets, vocab_size)
  mtf_mesh = mtf.Mesh(mtf.Graph(), "mesh")
  output = call(model, targets=ids_to_mtf(mtf_mesh, targets), mode=_EVAL,
                inputs=None if inputs is None else ids_to_mtf(mtf_mesh,
                                                               inputs))
  return mtf_mesh, output, list(mtf_mesh.graph.trainable_variables)


def variable_shapes(*, gin_text, vocab_size, model_type=None):
  """{mtf variable name: shape tuple} of the model's trainable variables."""
  with gin_scope(gin_text), tf.Graph().as_default():
    _, _, variables = _build(gin_text=gin_text, vocab_size=vocab_size,
                             kind=model_type)
    return {v.name: tuple(v.shape.to_integer_list) for v in variables}


def initial_variables(*, gin_text, vocab_size, seed, model_type=None):
  """{name: float32 array}: mtf's own initializers under graph seed `seed`."""
  with gin_scope(gin_text), tf.Graph().as_default() as graph:
    tf.compat.v1.set_random_seed(seed)
    # mtf makes each variable's master when it builds the graph: no lowering.
    _, _, variables = _build(gin_text=gin_text, vocab_size=vocab_size,
                             kind=model_type)
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = session.run({v.name: v.get_master() for v in variables})
  return {k: np.asarray(v, np.float32) for k, v in values.items()}


def assign_ops(variables, values, *, name_of=lambda variable: variable.name,
               what="model"):
  """Placeholders, their values and ops that load `values` into mtf masters.

  Args:
    variables: mtf Variables.
    values: {name: array}, one per variable, named as `name_of` names them.
    name_of: a variable's name in `values`.
    what: what the variables make up, for messages ("model", "layer").

  Returns:
    ({placeholder: float32 array}, [assign op]): run the ops with the feeds.

  Raises:
    ValueError listing missing and unknown names, or naming a variable whose
    value has the wrong shape, with both shapes and the mtf dimensions.
  """
  names = {name_of(v): v for v in variables}
  missing = sorted(set(names) - set(values))
  unknown = sorted(set(values) - set(names))
  if missing or unknown:
    raise ValueError(f"variables do not match the {what}: missing {missing}, "
                     f"unknown {unknown}; the {what} has {sorted(names)}.")
  feeds, ops = {}, []
  for name, variable in names.items():
    master = variable.get_master()
    value = np.asarray(values[name], np.float32)
    expected = tuple(master.shape.as_list())
    if value.shape != expected:
      raise ValueError(f"variable {name!r} has shape {value.shape}, expected "
                       f"{expected} {[d.name for d in variable.shape.dims]}.")
    placeholder = tf.compat.v1.placeholder(tf.float32, value.shape)
    ops.append(tf.compat.v1.assign(master, placeholder))
    feeds[placeholder] = value
  return feeds, ops


def logits(*, gin_text, vocab_size, variables, inputs=None, targets,
           model_type=None, mesh=None, rules=None):
  """float32 logits [batch, length, padded vocab] of the model, EVAL mode.

  Args:
    gin_text, vocab_size, model_type: as `build_model`.
    variables: {mtf variable name: array} for every trainable variable.
    inputs: int ids [batch, input length] for a Bitransformer, [batch,
      length] for "aligned"; None for "lm" and "delimited_lm".
    targets: int ids [batch, length]; 0 is padding for a Bitransformer.
    mesh: a thattn MeshSpec or its string; None runs on one device.
    rules: thattn LayoutRules or their string, with `mesh`.

  Raises:
    ValueError listing missing and unknown variable names, naming a
    misshapen variable with both shapes, or naming bad ids, model type,
    mesh or rules.
  """
  if mesh is None and rules is not None:
    raise ValueError(f"rules {str(rules)!r} need a mesh, got mesh=None.")
  with gin_scope(gin_text), tf.Graph().as_default() as graph:
    mtf_mesh, output, mtf_variables = _build(
        gin_text=gin_text, vocab_size=vocab_size, kind=model_type,
        inputs=inputs, targets=targets, mesh=mesh, rules=rules)
    feeds, assigns = assign_ops(mtf_variables, variables)
    lowering, _ = layout_lib.lower(mtf_mesh, mtf_variables, mesh=mesh,
                                   rules=rules)
    fetch = lowering.export_to_tf_tensor(output)
    # All ops made before the first run: TF warns of later graph changes.
    init = tf.compat.v1.global_variables_initializer()
    copy = lowering.copy_masters_to_slices()
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(init)
      session.run(assigns, feeds)
      session.run(copy)
      return np.asarray(session.run(fetch), np.float32)


def read_checkpoint(checkpoint_path):
  """{name: float32 array} of the model variables in a TF1 checkpoint.

  Optimizer slots ("..._slot_vr" etc.), `global_step`, thattn's trainer
  state (`TRAINER_SCOPE`) and non-float entries are skipped; bfloat16
  (T5's master dtype) and float16 are cast.
  ValueError naming `checkpoint_path` and the cause when it cannot be read.
  """
  try:
    reader = tf.train.load_checkpoint(checkpoint_path)
    dtypes = reader.get_variable_to_dtype_map()
    return {name: np.asarray(reader.get_tensor(name)).astype(np.float32)
            for name, dtype in sorted(dtypes.items())
            if dtype.is_floating and "_slot_" not in name
            and name != "global_step"
            and not name.startswith(TRAINER_SCOPE)}
  except (tf.errors.OpError, ValueError, OSError, IndexError) as error:
    # IndexError: TF's reader of a truncated .data file ("Read less bytes").
    raise ValueError(f"cannot read the checkpoint {checkpoint_path!r}: "
                     f"{type(error).__name__}: {error}") from error


def _steps(mtf_model_dir):
  """The steps N of the model.ckpt-N.index files in the dir, ascending."""
  pattern = os.path.join(mtf_model_dir, CHECKPOINT_PREFIX + "-*.index")
  matches = (_CHECKPOINT.fullmatch(os.path.basename(path)[:-len(".index")])
             for path in tf.io.gfile.glob(pattern))
  return sorted(int(match.group(1)) for match in matches if match)


def _state_file_step(mtf_model_dir):
  """The step the `checkpoint` state file names, or None."""
  try:
    state = tf.train.get_checkpoint_state(mtf_model_dir)
  except (tf.errors.OpError, ValueError):
    return None  # an unreadable state file: the steps on disk decide
  # By basename: the file may name the dir the run wrote (e.g. gs://...).
  match = state and _CHECKPOINT.fullmatch(
      os.path.basename(state.model_checkpoint_path))
  return int(match.group(1)) if match else None


def latest_checkpoint(mtf_model_dir, step=None):
  """The prefix DIR/model.ckpt-<step>, or of the newest checkpoint.

  The newest is the one the `checkpoint` state file names when its files
  exist, else the highest step. ValueError naming the dir and the steps it
  has when there is no checkpoint (of `step`).
  """
  steps = _steps(mtf_model_dir)
  if step is None and steps:
    named = _state_file_step(mtf_model_dir)
    step = named if named in steps else steps[-1]
  if step is None or step not in steps:
    wanted = "any checkpoint" if step is None else f"step {step}"
    raise ValueError(f"{mtf_model_dir} has no {CHECKPOINT_PREFIX}-N of "
                     f"{wanted}; it has steps {steps}.")
  return os.path.join(mtf_model_dir, f"{CHECKPOINT_PREFIX}-{step}")


def write_model_dir(*, mtf_model_dir, gin_text, variables, step):
  """Writes operative_config.gin and a TF1 checkpoint model.ckpt-<step>.

  The checkpoint holds float32 `variables` under exactly their names and
  an int64 `global_step`, with the `checkpoint` state file (relative
  paths), as mtf's Saver writes it. The dir is made if needed; atomic staging is the caller's job.
  """
  if "global_step" in variables:
    raise ValueError(f"got a 'global_step' variable; it is step={step}.")
  tf.io.gfile.makedirs(mtf_model_dir)
  with tf.io.gfile.GFile(os.path.join(mtf_model_dir, OPERATIVE_CONFIG),
                         "w") as f:
    f.write(gin_text)
  with tf.Graph().as_default() as graph:
    feeds, saved = {}, {}
    for index, (name, value) in enumerate(sorted(variables.items())):
      value = np.asarray(value, np.float32)
      placeholder = tf.compat.v1.placeholder(tf.float32, value.shape)
      # Saved under the dict key; graph names need not be checkpoint names.
      saved[name] = tf.compat.v1.Variable(placeholder, name=f"v{index}")
      feeds[placeholder] = value
    saved["global_step"] = tf.compat.v1.Variable(
        np.int64(step), dtype=tf.int64, name="global_step")
    # Relative paths in the `checkpoint` state file, as mtf's own Saver
    # writes them: tf.train.latest_checkpoint(dir) still resolves after the
    # dir is renamed (thattn-convert stages it) or moved.
    saver = tf.compat.v1.train.Saver(var_list=saved, max_to_keep=None,
                                     save_relative_paths=True)
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer(), feeds)
      saver.save(session, os.path.join(mtf_model_dir, CHECKPOINT_PREFIX),
                 global_step=step, write_meta_graph=False)
