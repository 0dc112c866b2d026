"""thattn-train --backend=mtf: T5s trained in Mesh TensorFlow.

The binary runs for real in subprocesses (a mesh of logical CPUs needs a
fresh process): 8 steps of a tiny talking-heads T5 with the Keras backend,
then with mtf's Bitransformer and AdafactorOptimizer on one device and on a
batch:2,model:2 mesh. Both backends start from the same weights (the mtf
run converts the Keras backbone the task builds under the same seed) and
read the same batches, so their per-step losses must agree. The same for
masked LM on a T5 encoder (mtf's aligned Unitransformer) and the causal LM
on T5's decoder (its LM Unitransformer).
"""

import io
import json
import os
import signal
import subprocess

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from tests import cli
from tests import forkserver
from tests.training import local_cluster
from thattn import models
from thattn import tasks
from thattn.data import tokenizers
from thattn.mtf import convert
from thattn.mtf import models as mtf_models
from thattn.mtf import training as mtf_training
from thattn.training import options as options_lib

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
_STEPS = 8


@pytest.fixture(scope="module")
def data_flags(tiny_bert_flags):
  return tiny_bert_flags[:2]  # a text file and its tokenizer (1000 ids)


def _command(model_dir, data_flags, *extra):
  flags = dict(task="span_corruption", preset="t5_tiny", batch_size=4,
               sequence_length=32, train_steps=_STEPS, warmup_steps=1,
               log_every=1, checkpoint_every=4, eval_every=0, eval_steps=2)
  return cli.command("train", f"--model_dir={model_dir}", "--deterministic",
                     *data_flags,
                     *[f"--{name}={value}" for name, value in flags.items()],
                     *extra)


def _train(model_dir, data_flags, *extra):
  return cli.run_ok(_command(model_dir, data_flags, *extra), _ENV)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_flags):
  """{name: (model_dir, stdout)} of the Keras run and the mtf run."""
  root = tmp_path_factory.mktemp("backends")
  return {
      "keras": (root / "keras",
                _train(root / "keras", data_flags, "--noexport")),
      "mtf": (root / "mtf", _train(root / "mtf", data_flags,
                                   "--backend=mtf", "--noexport")),
  }


def _assert_same_losses(mtf_dir, keras_dir, rtol=1e-4):
  """Step 1's loss (the same weights, the same batch) to 1e-5; later
  steps' to rtol, which covers float32 rounding carried through training.
  """
  mtf_losses = local_cluster.train_losses(str(mtf_dir))
  keras_losses = local_cluster.train_losses(str(keras_dir))
  assert sorted(mtf_losses) == list(range(1, _STEPS + 1))
  assert sorted(keras_losses) == sorted(mtf_losses)
  np.testing.assert_allclose(mtf_losses[1], keras_losses[1], rtol=1e-5)
  for step, loss in keras_losses.items():
    np.testing.assert_allclose(mtf_losses[step], loss, rtol=rtol,
                               err_msg=f"step {step}")
  # Training moved the loss: the comparison is not of two untrained models.
  assert keras_losses[_STEPS] < keras_losses[1] - 0.5


def test_one_device_equals_the_keras_backend_step_for_step(runs):
  keras_dir, _ = runs["keras"]
  mtf_dir, stdout = runs["mtf"]
  assert "Mesh TensorFlow Bitransformer" in stdout
  assert "one device" in stdout
  _assert_same_losses(mtf_dir, keras_dir)
  with open(mtf_dir / "summary.json") as f:
    mtf_summary = json.load(f)
  with open(keras_dir / "summary.json") as f:
    keras_summary = json.load(f)
  assert mtf_summary["backend"] == "mtf" and mtf_summary["steps"] == _STEPS
  for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after"):
    np.testing.assert_allclose(mtf_summary[key], keras_summary[key],
                               rtol=1e-4)


# summary.json keys that only one backend writes (docs/training.md's
# schema): none today.
_BACKEND_SPECIFIC = frozenset()


def test_both_backends_write_one_summary_schema_and_progress_format(runs):
  """The same tiny span-corruption job: the same summary.json keys and
  the same progress and result lines, from the one run driver."""
  summaries, formats = {}, {}
  for backend, (model_dir, stdout) in runs.items():
    with open(model_dir / "summary.json") as f:
      summaries[backend] = json.load(f)
    formats[backend] = local_cluster.line_formats(stdout)
  keras, mtf = summaries["keras"], summaries["mtf"]
  assert set(keras) - _BACKEND_SPECIFIC == set(mtf) - _BACKEND_SPECIFIC
  assert {keras["backend"], mtf["backend"]} == {"keras", "mtf"}
  assert formats["keras"] == formats["mtf"]
  assert formats["mtf"][1] == "step #/# loss # lr # # tokens/s ETA #m#s"
  assert len(formats["mtf"]) == _STEPS + 2  # before, each step, after


_MLM = ("--task=mlm", "--preset=t5_tiny_encoder")  # absl: the last wins


@pytest.fixture(scope="module")
def mlm_runs(tmp_path_factory, data_flags):
  """Masked LM on a T5 encoder: {name: model_dir} of both backends."""
  root = tmp_path_factory.mktemp("mlm_backends")
  _train(root / "keras", data_flags, *_MLM, "--noexport")
  _train(root / "mtf", data_flags, *_MLM, "--backend=mtf", "--noexport")
  return {"keras": root / "keras", "mtf": root / "mtf"}


def test_masked_lm_on_a_t5_encoder_equals_the_keras_backend(mlm_runs):
  """mtf's aligned Unitransformer, scored at the masked positions."""
  _assert_same_losses(mlm_runs["mtf"], mlm_runs["keras"])
  gin_text = mtf_models.read_operative_config(str(mlm_runs["mtf"]))
  assert mtf_models.model_type(gin_text) == "aligned"


def test_thattn_export_serves_the_mtf_masked_lm(mlm_runs, tmp_path):
  cli.run_ok(cli.command("export", f"--model_dir={mlm_runs['mtf']}",
                         f"--export_dir={tmp_path / 's'}"), _ENV, timeout=300)
  served = tf.saved_model.load(str(tmp_path / "s"))
  out = served.signatures["serving_default"](
      text=tf.constant(["The function returns a list of names."]))
  assert out["predicted_ids"].shape == out["input_word_ids"].shape
  assert out["logits"].shape[-1] == 1000


_LM = ("--task=causal_lm", "--preset=t5_tiny_lm")


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory, data_flags):
  """The causal LM on T5's decoder: {name: model_dir} of both backends."""
  root = tmp_path_factory.mktemp("lm_backends")
  _train(root / "keras", data_flags, *_LM, "--noexport")
  _train(root / "mtf", data_flags, *_LM, "--backend=mtf")
  return {"keras": root / "keras", "mtf": root / "mtf"}


def test_the_causal_lm_on_a_t5_decoder_equals_the_keras_backend(lm_runs):
  """mtf's LM Unitransformer, its targets shifted right as the Keras run's
  inputs are, every next token scored."""
  _assert_same_losses(lm_runs["mtf"], lm_runs["keras"])
  gin_text = mtf_models.read_operative_config(str(lm_runs["mtf"]))
  assert mtf_models.model_type(gin_text) == "lm"


def test_the_mtf_causal_lm_converts_and_its_export_continues_text(
    lm_runs, tmp_path):
  """The run's export (converted to Keras on the way) continues prompts
  as the converted backbone does, greedily."""
  keras_dir = tmp_path / "keras"
  convert.mtf_to_thattn(mtf_model_dir=str(lm_runs["mtf"]),
                        model_dir=str(keras_dir),
                        vocabulary=str(lm_runs["mtf"] / "tokenizer"),
                        sequence_length=32)
  config = json.loads((keras_dir / "run_config.json").read_text())
  assert config["task"] == "causal_lm"
  backbone = models.load(str(keras_dir))
  prompt = np.array([[0, 17, 40, 9]], np.int32)  # the start token first
  want = models.generate(backbone, prompt, max_length=32,
                         eos_id=config["eos_id"],
                         pad_id=config["pad_id"])["tokens"].numpy()
  served = tf.saved_model.load(str(lm_runs["mtf"] / "export"))
  got = served.signatures["serve_token_ids"](
      prompt_tokens=tf.constant(prompt))["tokens"].numpy()
  np.testing.assert_array_equal(got, want)
  # A text prompt is given the start token 0 first, as training inputs.
  tokenizer = tokenizers.load(str(lm_runs["mtf"] / "tokenizer"))
  prompt_text = "The function returns"
  from_text = served.signatures["serving_default"](
      text=tf.constant([prompt_text]))
  ids = tokenizer.tokenize(tf.constant([prompt_text])).numpy()[0]
  from_ids = served.signatures["serve_token_ids"](
      prompt_tokens=tf.constant([[0, *ids]], tf.int32))["tokens"]
  np.testing.assert_array_equal(from_text["tokens"].numpy(),
                                from_ids.numpy())
  assert isinstance(from_text["text"].numpy()[0], bytes)
  # thattn-generate prints the same continuation (greedy, 32 tokens).
  stdout = cli.run_ok(cli.command(
      "generate", f"--model_dir={lm_runs['mtf']}",
      f"--prompt={prompt_text}", "--max_length=32"), _ENV, timeout=300)
  want_text = tokenizer.detokenize(tf.RaggedTensor.from_tensor(
      from_ids, padding=config["pad_id"])).numpy()[0].decode()
  assert stdout.splitlines()[-2:] == [f"> {prompt_text}", want_text]


@pytest.fixture(scope="module")
def t5_vocabulary_flags(tmp_path_factory, heldout_paragraphs):
  """--train_files and --tokenizer: a T5 vocabulary (</s> = 1), as mtf's
  delimited LM reads the end token."""
  folder = tmp_path_factory.mktemp("t5_vocabulary")
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(heldout_paragraphs[:2000]), model_writer=model,
      vocab_size=300, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
      bos_id=-1, num_threads=1, minloglevel=2)
  tokenizers.T5SentencepieceTokenizer(model.getvalue(), extra_ids=100).save(
      str(folder / "tokenizer"))
  (folder / "train.txt").write_text("\n\n".join(heldout_paragraphs[:200]))
  return [f"--train_files={folder / 'train.txt'}",
          f"--tokenizer={folder / 'tokenizer'}"]


def test_the_prefix_lm_is_mtfs_delimited_lm_and_converts_both_ways(
    t5_vocabulary_flags, tmp_path):
  """Step for step as the Keras backend (the bidirectional prefix and
  position bias, the targets alone scored); converted to thattn, it is a
  prefix_lm run, and back, mtf's delimited LM again."""
  flags = ("--task=prefix_lm", "--preset=t5_tiny_lm", "--noexport")
  _train(tmp_path / "keras", t5_vocabulary_flags, *flags)
  _train(tmp_path / "mtf", t5_vocabulary_flags, *flags, "--backend=mtf")
  _assert_same_losses(tmp_path / "mtf", tmp_path / "keras")
  gin_text = mtf_models.read_operative_config(str(tmp_path / "mtf"))
  assert mtf_models.model_type(gin_text) == "delimited_lm"
  assert "Unitransformer.input_full_attention = True" in gin_text
  convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "mtf"),
                        model_dir=str(tmp_path / "converted"),
                        vocabulary=str(tmp_path / "mtf" / "tokenizer"),
                        sequence_length=32, log=lambda line: None)
  config = json.loads((tmp_path / "converted" / "run_config.json")
                      .read_text())
  assert config["task"] == "prefix_lm"
  assert config["overrides"]["prefix_lm"] is True
  convert.thattn_to_mtf(model_dir=str(tmp_path / "converted"),
                        mtf_model_dir=str(tmp_path / "back"),
                        log=lambda line: None)
  back = mtf_models.read_operative_config(str(tmp_path / "back"))
  assert mtf_models.model_type(back) == "delimited_lm"
  assert "Unitransformer.input_full_attention = True" in back


def test_the_model_dir_is_an_mtf_model_dir_that_converts_to_keras(
    runs, tmp_path):
  keras_dir, _ = runs["keras"]
  mtf_dir, _ = runs["mtf"]
  assert mtf_models.latest_checkpoint(str(mtf_dir)).endswith(
      f"model.ckpt-{_STEPS}")
  gin_text = mtf_models.read_operative_config(str(mtf_dir))
  assert mtf_models.model_type(gin_text) == "bitransformer"
  reader = tf.train.load_checkpoint(str(mtf_dir / f"model.ckpt-{_STEPS}"))
  names = reader.get_variable_to_shape_map()
  assert reader.get_tensor("global_step") == _STEPS
  assert any(name.endswith("_slot_v") for name in names)  # Adafactor's
  with open(mtf_dir / "run_config.json") as f:
    assert json.load(f)["backend"] == "mtf"
  # mtf's trained weights, converted, are the Keras backend's trained ones.
  out = tmp_path / "converted"
  convert.mtf_to_thattn(mtf_model_dir=str(mtf_dir), model_dir=str(out),
                        vocabulary=str(mtf_dir / "tokenizer"),
                        sequence_length=32, log=lambda line: None)
  converted = models.load(str(out))
  trained = models.load(str(keras_dir))
  weights = {w.name: w.numpy() for w in trained.weights}
  assert len(converted.weights) == len(weights) > 30
  for weight in converted.weights:
    np.testing.assert_allclose(weight.numpy(), weights[weight.name],
                               atol=1e-4, err_msg=weight.name)


def test_thattn_export_serves_text(runs, tmp_path):
  mtf_dir, _ = runs["mtf"]
  stdout = cli.run_ok(cli.command("export", f"--model_dir={mtf_dir}",
                                  f"--export_dir={tmp_path / 'served'}"),
                      _ENV, timeout=300)
  assert f"model.ckpt-{_STEPS} (step {_STEPS})" in stdout  # converted
  # The converted copy was staged beside the target, and is gone.
  assert os.listdir(tmp_path) == ["served"]
  served = tf.saved_model.load(str(tmp_path / "served"))
  out = served.signatures["serving_default"](
      text=tf.constant(["The function returns a list of names."]))
  assert out["text"].shape == (1,) and out["tokens"].shape[0] == 1


def test_a_bad_layout_is_refused_then_a_4_device_mesh_equals_keras(
    runs, data_flags, tmp_path, unchanged):
  """heads=4 on model:3 is refused before a file is written (a model_dir
  the user made stays empty: no run_config.json, gin, tokenizer or lock);
  the rerun on batch:2,model:2 trains there, equal to the Keras backend."""
  keras_dir, _ = runs["keras"]
  model_dir = tmp_path / "mesh"
  model_dir.mkdir()
  with unchanged(model_dir):
    result = forkserver.run(
        _command(model_dir, data_flags, "--backend=mtf", "--noexport",
                 "--mesh_shape=model:3", "--layout_rules=heads:model"),
        env=_ENV, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode != 0
  assert "heads=4 is not divisible by model=3" in result.stderr, (
      result.stderr[-3000:])
  assert os.listdir(model_dir) == []  # not even the lock
  stdout = _train(model_dir, data_flags, "--backend=mtf",
                  "--mesh_shape=batch:2,model:2", "--noexport")
  assert "4 logical devices" in stdout
  sharded = [line for line in stdout.splitlines()
             if "mesh batch:2,model:2" in line]
  assert sharded, stdout
  # Heads, d_ff and vocabulary on `model`: most variables are split.
  count = int(sharded[0].split("mesh batch:2,model:2, ")[1].split()[0])
  assert count >= 20, sharded[0]
  # The mesh sums over devices in its own order. Adafactor divides each
  # update by its gradient's own root mean square, so a weight whose
  # gradient is at rounding level takes a full-size step of either sign:
  # that order's last-bit differences grew to 1.3e-4 by step 6 in one CI
  # run (1e-7 on this machine). A wrong layout moves the loss by far more.
  _assert_same_losses(model_dir, keras_dir, rtol=1e-3)


def test_sigkill_then_rerun_matches_an_uninterrupted_run(runs, data_flags,
                                                         tmp_path):
  mtf_dir, _ = runs["mtf"]
  killed = tmp_path / "killed"
  process = forkserver.Popen(_command(killed, data_flags, "--backend=mtf",
                                      "--noexport"),
                             env=_ENV, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
  for line in process.stdout:
    if line.startswith(f"step      6/{_STEPS}"):  # checkpoint 4 is saved
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  rerun = _train(killed, data_flags, "--backend=mtf", "--noexport")
  assert "at step 4" in rerun
  steps = [line.split()[1] for line in rerun.splitlines()
           if line.startswith("step ")]
  assert steps == [f"{step}/{_STEPS}" for step in range(5, _STEPS + 1)]
  with open(killed / "summary.json") as f:
    resumed = json.load(f)
  with open(mtf_dir / "summary.json") as f:
    straight = json.load(f)
  assert resumed["resumed_from_step"] == 4
  for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after"):
    assert resumed[key] == straight[key]
  assert (local_cluster.train_losses(str(killed))[_STEPS] ==
          local_cluster.train_losses(str(mtf_dir))[_STEPS])


@pytest.mark.parametrize("options, message", [
    (dict(strategy="mirrored"), "--strategy=mirrored does not apply"),
    (dict(optimizer="adam"), "--optimizer=adam does not apply"),
    (dict(mixed_precision="bfloat16"), "it trains in float32"),
    (dict(layout_rules="heads:model"), "needs --mesh_shape"),
    (dict(mesh_shape="batch:2,model:2", layout_rules="heads:data"),
     "data"),
])
def test_options_mtf_cannot_train_are_refused(options, message):
  with pytest.raises(ValueError, match=message):
    options_lib.TrainOptions(backend="mtf", **options)


def test_tasks_and_models_mtf_cannot_train_are_refused(tmp_path):
  options = options_lib.TrainOptions(backend="mtf")
  with pytest.raises(ValueError, match="--task=mlm with preset 'bert_tiny' "
                     "has no Mesh TensorFlow model"):
    mtf_training.train(model_dir=str(tmp_path / "mlm"), task="mlm",
                       options=options)
  # t5_tiny's own dropout (0.1), as the library gets it without overrides.
  with pytest.raises(ValueError, match="dropout_rate=0.1"):
    mtf_training.train(model_dir=str(tmp_path / "t5"),
                       model=tasks.ModelOptions(preset="t5_tiny"),
                       options=options)
  assert not os.listdir(tmp_path)  # refused before anything was written


def test_a_keras_model_dir_is_not_resumed_by_mtf(runs, data_flags):
  keras_dir, _ = runs["keras"]
  before = sorted(os.listdir(keras_dir))
  result = forkserver.run(_command(keras_dir, data_flags, "--backend=mtf"),
                          env=_ENV, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode != 0
  assert "backend" in result.stderr and "run_config" in result.stderr
  assert sorted(os.listdir(keras_dir)) == before
