"""--task=causal_lm: packed next-token batches, JSON-lines documents, a
tf_keras run that learns and whose export continues text, the backbone
`thattn.models.load` gives back, and the runs it refuses by name. (The
same run on Keras 3, step for step: tests/training/keras3_tasks_test.py.)
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from thattn import models
from thattn.data import batches
from thattn.tasks import text


def test_a_batch_predicts_each_rows_next_token():
  rows = np.arange(3 * 6, dtype=np.int32).reshape(3, 6)
  batch = next(iter(batches.lm_batches(rows, batch_size=2, seed=0,
                                       shuffle=False)))
  np.testing.assert_array_equal(batch["inputs"].numpy(), rows[:2, :5])
  np.testing.assert_array_equal(batch["targets"].numpy(), rows[:2, 1:])


def test_json_lines_give_one_document_a_line(tmp_path):
  path = tmp_path / "docs.jsonl"
  path.write_text(json.dumps({"text": "First doc.\nIts second line."}) +
                  "\n\n" + json.dumps({"text": "Second.", "id": 7}) + "\n")
  assert text._documents(str(path)) == [  # pylint: disable=protected-access
      "First doc.\nIts second line.", "Second."]


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\n{"text": \n', "line 2: not JSON"),
    ('{"body": "no text field"}\n', "line 1: expected an object with a "
     "string 'text' field"),
])
def test_bad_json_lines_are_named(tmp_path, content, message):
  path = tmp_path / "bad.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError, match=message):
    text._documents(str(path))  # pylint: disable=protected-access


def test_json_lines_and_plain_text_are_not_mixed(tmp_path):
  (tmp_path / "a.jsonl").write_text('{"text": "one"}\n')
  (tmp_path / "b.txt").write_text("two\n")
  with pytest.raises(ValueError, match="matches JSON-lines and plain-text"):
    text._documents(str(tmp_path / "*"))  # pylint: disable=protected-access


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_flags):
  """A 30-step GPT-2-shaped causal LM with talking heads, exported."""
  model_dir = tmp_path_factory.mktemp("causal_lm") / "run"
  flags = [flag for flag in tiny_bert_flags
           if not flag.startswith(("--preset", "--noexport"))]
  stdout = cli.run_ok(cli.command(
      "train", f"--model_dir={model_dir}", "--task=causal_lm",
      "--preset=gpt2_tiny", "--attention=talking_heads", "--train_steps=30",
      "--checkpoint_every=30", "--learning_rate=0.01", *flags))
  return model_dir, stdout


def test_the_run_learns_and_its_export_continues_text(run):
  model_dir, stdout = run
  assert "causal_lm:" in stdout
  summary = json.loads((model_dir / "summary.json").read_text())
  assert summary["held_out_ln_ppl_after"] < summary["held_out_ln_ppl_before"]
  served = tf.saved_model.load(str(model_dir / "export"))
  outputs = served.signatures["serving_default"](
      tf.constant(["The first", "A longer prompt than the first one"]))
  assert outputs["tokens"].shape == (2, 32)
  assert all(isinstance(item, bytes) for item in outputs["text"].numpy())
  # The export's continuation is the loaded backbone's greedy one.
  backbone = models.load(str(model_dir))
  config = json.loads((model_dir / "run_config.json").read_text())
  prompt = np.array([[5, 9, 14]], np.int32)
  want = models.generate(backbone, prompt, max_length=32,
                         eos_id=config["eos_id"],
                         pad_id=config["pad_id"])["tokens"].numpy()
  got = served.signatures["serve_token_ids"](
      prompt_tokens=tf.constant(prompt))["tokens"].numpy()
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("flags, message", [
    (["--preset=t5_tiny"], "--task=causal_lm needs a decoder-only LM (or "
     "a T5 with stacks='decoder') preset, got 't5_tiny'"),
    (["--backend=mtf"], "has no Mesh TensorFlow model here"),
])
def test_runs_it_cannot_train_are_refused_by_name(tmp_path, flags, message):
  result = cli.run(cli.command("train", f"--model_dir={tmp_path / 'x'}",
                               "--task=causal_lm", "--train_steps=1",
                               *flags))
  assert result.returncode != 0
  assert message in result.stderr + result.stdout


def test_thattn_generate_prints_the_exports_continuations(run, tmp_path):
  """Greedy: the text the export serves for each prompt; sampling: the
  same text for the same seed."""
  model_dir, _ = run
  prompts = ["The first", "A longer prompt than the first one"]
  served = tf.saved_model.load(str(model_dir / "export"))
  want = [text.decode() for text in served.signatures["serving_default"](
      tf.constant(prompts))["text"].numpy()]
  stdout = cli.run_ok(cli.command(
      "generate", f"--model_dir={model_dir}", *(f"--prompt={prompt}"
                                                for prompt in prompts)))
  assert stdout.splitlines()[-4:] == [f"> {prompts[0]}", want[0],
                                      f"> {prompts[1]}", want[1]]
  sample = cli.command("generate", f"--model_dir={model_dir}",
                       "--prompt=The first", "--method=sample",
                       "--top_k=5", "--seed=7", "--max_length=6")
  assert cli.run_ok(sample).splitlines()[-1] == (
      cli.run_ok(sample).splitlines()[-1])


def test_thattn_generate_refuses_a_run_of_another_task(run, tmp_path):
  model_dir, _ = run
  config = json.loads((model_dir / "run_config.json").read_text())
  other = tmp_path / "mlm"
  other.mkdir()
  (other / "run_config.json").write_text(json.dumps(dict(config,
                                                         task="mlm")))
  result = cli.run(cli.command("generate", f"--model_dir={other}",
                               "--prompt=x"))
  assert result.returncode != 0
  assert ("is a --task=mlm run; thattn-generate continues text with a "
          "causal_lm or prefix_lm run") in result.stderr
