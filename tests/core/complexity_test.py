"""Tests for thattn.core.complexity: the paper's tables are the specification."""

import dataclasses
import os
import re

import numpy as np
import pytest

from tests import cli
from tests import forkserver
from thattn.core import complexity
from thattn.core import variants
from thattn.core.complexity import AttentionShape

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row_id(row):
  s = row.shape
  return f"table{row.table}-{row.label}-{s.h_k}.{s.h}.{s.h_v}-{s.d_k}.{s.d_v}"


@pytest.mark.parametrize("row", complexity.PAPER_ROWS, ids=_row_id)
def test_parameters_equal_the_paper(row):
  assert complexity.parameters(row.shape) == row.parameters


# General bilinear is left out on purpose; see the next test.
@pytest.mark.parametrize(
    "row",
    [r for r in complexity.PAPER_ROWS
     if r.shape.variant != "general_bilinear"],
    ids=_row_id)
def test_multiplies_match_the_paper_to_printed_digits(row):
  # The paper prints 4 significant digits, so it is off by at most 0.05% of
  # a mantissa >= 1.
  assert complexity.multiplies(row.shape) == pytest.approx(row.multiplies,
                                                           rel=5e-4)


def test_general_bilinear_multiplies_are_counted_honestly():
  (row,) = [r for r in complexity.PAPER_ROWS
            if r.shape.variant == "general_bilinear"]
  h, d, n, m = 12, 768, 512, 512
  # L = (X.P).M and Y = W.(M.Q): two n*d*d*h and two n*m*d*h einsums.
  assert complexity.multiplies(row.shape) == 2 * h * (n * d * d + n * m * d)
  # The printed 7.650e9 is the same count with h dropped from the n*m terms,
  # as the comment in complexity.py says.
  assert h * n * d * d + h * m * d * d + n * m * 2 * d == pytest.approx(
      row.multiplies, rel=5e-4)


SECTION_5_SHAPES = [
    AttentionShape("multi_head", num_heads=8, key_dim=16, value_dim=24,
                   d_model=100, query_length=7, memory_length=11),
    AttentionShape("talking_heads", num_heads=5, key_dim=16, value_dim=24,
                   num_key_heads=3, num_value_heads=4, d_model=100,
                   query_length=7, memory_length=11),
    AttentionShape("talking_heads", num_heads=5, key_dim=8, num_key_heads=3,
                   num_value_heads=5, project_weights=False, d_model=64,
                   query_length=9, memory_length=2),
]


@pytest.mark.parametrize("shape", SECTION_5_SHAPES, ids=complexity.describe)
def test_multiplies_follow_section_5(shape):
  s, n, m, d = shape, shape.query_length, shape.memory_length, shape.d_model
  mixing = n * m * s.h * ((s.h_k if s.project_logits else 0) +
                          (s.h_v if s.project_weights else 0))
  if s.variant == "multi_head":
    expected = s.h * (s.d_k + s.d_v) * (n * d + m * d + n * m)
  else:
    expected = ((s.d_k * s.h_k + s.d_v * s.h_v) * (n * d + m * d + n * m)
                + mixing)
  assert complexity.multiplies(shape) == expected


def test_talking_heads_without_projections_costs_as_multi_head():
  multi_head = AttentionShape("multi_head", num_heads=12, key_dim=64)
  neither = AttentionShape("talking_heads", num_heads=12, key_dim=64,
                           project_logits=False, project_weights=False)
  assert complexity.parameters(neither) == complexity.parameters(multi_head)
  assert complexity.multiplies(neither) == complexity.multiplies(multi_head)


def test_biases_are_those_of_bert_base():
  # BERT-base self-attention: 4 dense 768x768 layers with biases.
  shape = AttentionShape("multi_head", num_heads=12, key_dim=64,
                         use_bias=True)
  assert complexity.parameters(shape) == 4 * (768 * 768 + 768)


def test_output_dim_sizes_only_the_output_projection():
  shape = AttentionShape("multi_head", num_heads=2, key_dim=3, d_model=10,
                         output_dim=7, query_length=5, memory_length=4)
  # P_q, P_k: 10*3*2 each; P_v: 10*3*2; P_o: 7*3*2.
  assert complexity.parameters(shape) == 3 * 60 + 42
  # Q 5*10*6, K 4*10*6, V 4*10*6, J 5*4*6, O 5*4*6, Y 5*7*6.
  assert complexity.multiplies(shape) == 300 + 240 + 240 + 120 + 120 + 210


def test_one_head_group_is_the_papers_talking_heads():
  shape = AttentionShape("talking_heads", num_heads=24, key_dim=32,
                         num_head_groups=1)
  # Table 1, talking-heads, h_k = h = h_v = 24.
  assert complexity.parameters(shape) == 2360448
  assert complexity.multiplies(shape) == pytest.approx(1.913e9, rel=5e-4)


@pytest.mark.parametrize("h_k,h,h_v,groups",
                         [(12, 12, 12, 12), (6, 12, 24, 3)])
def test_head_groups_keep_one_in_g_of_every_mixing_weight(h_k, h, h_v, groups):
  ungrouped = AttentionShape("talking_heads", num_heads=h, key_dim=64,
                             num_key_heads=h_k, num_value_heads=h_v,
                             dynamic_projections=("x2l", "m2w"))
  grouped = dataclasses.replace(ungrouped, num_head_groups=groups)
  n, m, d = 512, 512, 768
  # P_l, P_Xl[d_X, h_k, h] and P_w, P_Mw[d_M, h, h_v] become block-diagonal.
  weights = (1 + d) * (h_k * h + h * h_v)
  work = (n * m + n * d) * h_k * h + (n * m + m * d) * h * h_v
  assert (complexity.parameters(ungrouped) - complexity.parameters(grouped)
          == weights * (groups - 1) // groups)
  assert (complexity.multiplies(ungrouped) - complexity.multiplies(grouped)
          == work * (groups - 1) // groups)


@pytest.mark.parametrize("name,positions,heads", [
    ("x2l", "n", (3, 5)), ("m2l", "m", (3, 5)),
    ("x2w", "n", (5, 4)), ("m2w", "m", (5, 4))])
def test_dynamic_projections_cost_their_generation(name, positions, heads):
  # Appendix A: R_Xl[n, h_k, h] = einsum(X[n, d_X], P_Xl[d_X, h_k, h]) and
  # R_Ml[m, h_k, h] = einsum(M[m, d_M], P_Ml[d_M, h_k, h]); likewise for w.
  static = AttentionShape("talking_heads", num_heads=5, key_dim=8,
                          num_key_heads=3, num_value_heads=4, d_model=32,
                          query_length=7, memory_length=11)
  dynamic = dataclasses.replace(static, dynamic_projections=[name])
  length = {"n": 7, "m": 11}[positions]
  assert (complexity.parameters(dynamic) - complexity.parameters(static)
          == 32 * heads[0] * heads[1])
  assert (complexity.multiplies(dynamic) - complexity.multiplies(static)
          == length * 32 * heads[0] * heads[1])


def test_one_group_per_head_leaves_one_weight_per_head():
  shape = AttentionShape("talking_heads", num_heads=12, key_dim=64,
                         num_head_groups=12)
  multi_head = AttentionShape("multi_head", num_heads=12, key_dim=64)
  # P_l and P_w become diagonal: h_k*h/h + h*h_v/h = 24 weights.
  assert complexity.parameters(shape) == complexity.parameters(
      multi_head) + 24
  assert complexity.multiplies(shape) == complexity.multiplies(
      multi_head) + 512 * 512 * 24


@pytest.mark.parametrize("headwise", [False, True], ids=["element", "head"])
@pytest.mark.parametrize("use_bias", [False, True])
def test_the_gate_adds_its_projection_and_its_products(headwise, use_bias):
  """Gated attention (Qiu et al., 2025): P_g[d_X, h, d_v] (head-wise
  [d_X, h]) and its bias; making G costs n d_X h d_v (n d_X h), applying
  it n h d_v."""
  plain = AttentionShape("multi_head", num_heads=12, key_dim=64,
                         use_bias=use_bias)
  gated = dataclasses.replace(plain, use_gate=True, headwise_gate=headwise)
  gates = 12 if headwise else 12 * 64
  assert complexity.parameters(gated) - complexity.parameters(plain) == (
      (768 + use_bias) * gates)
  assert complexity.multiplies(gated) - complexity.multiplies(plain) == (
      512 * 768 * gates + 512 * 12 * 64)
  assert complexity.variant_shape(
      "gated_headwise" if headwise else "gated", num_heads=12,
      use_bias=use_bias) == gated


@pytest.mark.parametrize("name, sizes", [
    ("gated", {}), ("gated_headwise", {}), ("differential", {}),
    ("differential", {"num_key_value_heads": 2, "use_gate": True}),
    ("dcmha", {}), ("dcmha", {"dynamic_hidden_dim": 5}),
    ("dcmha", {"num_key_value_heads": 2, "dynamic_rank": 3,
               "static_mix": True, "use_gate": True})])
def test_the_family_variants_count_what_their_layers_hold(name, sizes):
  layer = variants.make_attention("tf_keras", name, 4, 8, use_bias=True,
                                  **sizes)
  layer(np.zeros((1, 2, 24), "float32"), np.zeros((1, 2, 24), "float32"))
  shape = complexity.variant_shape(name, num_heads=4, d_model=24,
                                   key_dim=8, use_bias=True, **sizes)
  assert layer.count_params() == complexity.parameters(shape)


def test_differential_attention_adds_lambda_and_the_difference():
  """h maps of d_k paired into h/2 heads of 2 d_k: multi-head attention's
  projections and products, the four lambda vectors [d_k], lambda times
  the second maps (n m h/2) and the heads' RMSNorm (3 n h d_k)."""
  plain = AttentionShape("multi_head", num_heads=12, key_dim=64)
  differential = dataclasses.replace(plain, variant="differential")
  assert complexity.parameters(differential) - complexity.parameters(
      plain) == 4 * 64
  assert complexity.multiplies(differential) - complexity.multiplies(
      plain) == 512 * 512 * 6 + 3 * 512 * 12 * 64


def test_dcmha_s_weights_are_the_released_state_dicts():
  """D_1, Q_kw and D_d at DCFormer-2.8B's shape are the 1,703,936 weights
  per layer of its state dict's dw1 [2560, 1, 4, 128], qkw [1, 4, 128, 4,
  32] and dd [2560, 1, 128] (docs/family_sources.md, 1.3); DCPythia-6.9B's
  (d = 4096, d_k = 128) 2,686,976."""
  for d_model, key_dim, extra in ((2560, 80, 1_703_936),
                                  (4096, 128, 2_686_976)):
    plain = AttentionShape("multi_head", num_heads=32, key_dim=key_dim,
                           d_model=d_model)
    dcmha = dataclasses.replace(plain, variant="dcmha")
    assert complexity.parameters(dcmha) - complexity.parameters(
        plain) == extra
    assert extra == (d_model * 4 * 128 + 4 * 128 * 4 * 32 +
                     d_model * 4 * 32)


def test_dcmha_adds_its_generators_and_composes():
  """Per position and side, two slots of hidden units, factors, gates
  and w_1's norm; per query-key pair and stage, both sides' rank-R mixes
  and gates (4 R h + 2 h), and h * h more with the static mix."""
  plain = AttentionShape("multi_head", num_heads=8, key_dim=16, d_model=128,
                         query_length=10, memory_length=12)
  dcmha = dataclasses.replace(plain, variant="dcmha")
  per_position = (2 * 128 * 32 + 2 * 32 * 4 * 8 + 2 * 128 * 8 + 4 * 2 * 8)
  assert complexity.multiplies(dcmha) - complexity.multiplies(plain) == (
      22 * per_position + 2 * 120 * (4 * 2 * 8 + 2 * 8))
  static = dataclasses.replace(dcmha, static_mix=True)
  assert complexity.multiplies(static) - complexity.multiplies(dcmha) == (
      2 * 120 * 64)
  assert complexity.parameters(static) - complexity.parameters(dcmha) == (
      2 * 64)


BAD_SHAPES = [
    (dict(variant="grouped_heads", num_heads=12, key_dim=64),
     "(?i)unknown variant 'grouped_heads'; expected one of"),
    (dict(variant="multi_head", num_heads=0, key_dim=64),
     "num_heads must be a positive integer, got 0"),
    (dict(variant="multi_head", num_heads=12, key_dim=-64),
     "key_dim must be a positive integer, got -64"),
    (dict(variant="multi_head", num_heads=12, key_dim=64, query_length=1.5),
     "query_length must be a positive integer, got 1.5"),
    (dict(variant="talking_heads", num_heads=12),
     "talking_heads needs key_dim"),
    (dict(variant="multi_head", num_heads=12, key_dim=64, num_key_heads=6),
     "h_k == h == h_v, got num_key_heads=6, num_heads=12"),
    (dict(variant="multi_head", num_heads=12, key_dim=64,
          project_logits=False),
     "project_logits applies only to talking_heads.*'multi_head'"),
    (dict(variant="talking_heads", num_heads=12, key_dim=64, num_key_heads=6,
          project_logits=False),
     r"needs h_k == h, got num_key_heads=6, num_heads=12"),
    (dict(variant="talking_heads", num_heads=12, key_dim=64,
          num_value_heads=24, project_weights=False),
     r"needs h == h_v, got num_heads=12, num_value_heads=24"),
    (dict(variant="talking_heads", num_heads=12, key_dim=64,
          dynamic_projections=("x2l", "q2l")),
     r"dynamic_projections must be distinct names .*\('x2l', 'q2l'\)"),
    (dict(variant="talking_heads", num_heads=12, key_dim=64,
          dynamic_projections=("x2w", "x2w")),
     r"distinct .*\('x2w', 'x2w'\)"),
    (dict(variant="talking_heads", num_heads=12, key_dim=64,
          project_logits=False, dynamic_projections=("m2l",)),
     "'m2l' is added to P_l, so it needs project_logits=True"),
    (dict(variant="talking_heads", num_heads=12, key_dim=64,
          num_value_heads=20, num_head_groups=8),
     "num_head_groups=8 must divide h_k, h and h_v, got h_k=12"),
    (dict(variant="multi_head", num_heads=12, key_dim=64, num_head_groups=2),
     "num_head_groups applies only to talking_heads"),
    (dict(variant="general_bilinear", num_heads=12, key_dim=64),
     "general_bilinear takes no key_dim .* got key_dim=64"),
    (dict(variant="general_bilinear", num_heads=12, use_bias=True),
     "general_bilinear has no biases"),
    (dict(variant="multi_head", num_heads=12, key_dim=64,
          headwise_gate=True),
     "headwise_gate=True .* needs use_gate=True"),
    (dict(variant="differential", num_heads=3, key_dim=64),
     "num_heads .* must be even; got num_heads=3"),
    (dict(variant="multi_head", num_heads=12, key_dim=64, dynamic_rank=3),
     "dynamic_rank applies only to dcmha, got variant='multi_head'"),
    (dict(variant="dcmha", num_heads=12, key_dim=64, dynamic_rank=0),
     "dynamic_rank must be a positive integer, got 0"),
]


@pytest.mark.parametrize("kwargs,message", BAD_SHAPES,
                         ids=[m[:40] for _, m in BAD_SHAPES])
def test_bad_shapes_raise_value_error_naming_the_values(kwargs, message):
  with pytest.raises(ValueError, match=message):
    AttentionShape(**kwargs)


def test_format_count_prints_like_the_paper():
  assert complexity.format_count(1610612736) == "1.611e9"
  assert complexity.format_count(12079595520) == "1.208e10"


def _run_cli(*flags):
  return forkserver.run(
      cli.command("complexity", *flags),
      cwd=REPO_ROOT, capture_output=True, text=True, check=False)


def test_cli_prints_the_paper_configurations():
  result = _run_cli()
  assert result.returncode == 0, result.stderr
  lines = result.stdout.strip().splitlines()
  assert lines[0].startswith("| variant | h_k | h | h_v | d_k | d_v |")
  assert "(n=512, m=512)" in lines[0]
  assert len(lines) == 2 + len(complexity.paper_shapes())
  assert ("| talking_heads | 12 | 12 | 12 | 64 | 64 | 2359584 | 1.686e9 |"
          in lines)
  assert "| multi_head | 24 | 24 | 24 | 64 | 64 | 4718592 | 3.221e9 |" in lines


def test_cli_prints_one_configuration_and_rejects_bad_ones():
  result = _run_cli("--variant=talking_heads", "--num_heads=12",
                    "--key_dim=64", "--dynamic_projections=x2l")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().splitlines()[2] == (
      "| talking_heads (x2l) | 12 | 12 | 12 | 64 | 64 | 2470176 | 1.743e9 |")
  bad = _run_cli("--variant=talking_heads", "--num_heads=12", "--key_dim=64",
                 "--num_head_groups=5")
  assert bad.returncode != 0
  assert re.search("num_head_groups=5 must divide", bad.stderr)
