"""Adafactor's plain-Python rules, shared by both front ends' optimizers.

`thattn.optimizers` (tf_keras) and `thattn.keras3.optimizers` (Keras 3)
compute the same Adafactor step; what decides its structure (which axes a
variable's second moments are factored over) and which arguments are
valid is here, once, with no framework.
"""

import numbers

from thattn import validation


def factored_axes(shape, min_dim_size_to_factor):
  """The (largest, second largest) axes to factor over, or None.

  As Mesh TensorFlow chooses them: a stable sort of the axes by decreasing
  size, so on ties the earlier axis counts as the larger. Factor only when
  the second largest axis has at least `min_dim_size_to_factor` elements.
  """
  shape = list(shape)
  if len(shape) < 2:
    return None
  by_size = sorted(range(len(shape)), key=lambda axis: -shape[axis])
  largest, second = by_size[:2]
  if shape[second] < min_dim_size_to_factor:
    return None
  return largest, second


def drop(shape, axis):
  """`shape` (a list) without `axis`."""
  shape = list(shape)
  return shape[:axis] + shape[axis + 1:]


def check_arguments(*, learning_rate, decay_rate, beta1, clipping_threshold,
                    min_dim_size_to_factor, epsilon1, epsilon2):
  """Raises ValueError naming the first bad Adafactor argument."""
  if isinstance(learning_rate, numbers.Real) and not learning_rate >= 0:
    raise ValueError(f"learning_rate must be >= 0, got {learning_rate}.")
  if not 0.0 < decay_rate <= 1.0:
    raise ValueError(f"decay_rate (the exponent c in beta2 = 1 - t**-c) must "
                     f"be in (0, 1], got {decay_rate}.")
  validation.rate("beta1", beta1)
  if clipping_threshold is not None and not clipping_threshold > 0:
    raise ValueError(f"clipping_threshold must be > 0 or None, got "
                     f"{clipping_threshold}.")
  validation.positive_int("min_dim_size_to_factor", min_dim_size_to_factor)
  if not epsilon1 > 0:
    raise ValueError(f"epsilon1 must be > 0, got {epsilon1}.")
  if not epsilon2 >= 0:
    raise ValueError(f"epsilon2 must be >= 0, got {epsilon2}.")


def check_schedule(warmup_steps, total_steps, decay_fraction):
  """The inverse-square-root schedule's arguments, or ValueError."""
  validation.positive_int("warmup_steps", warmup_steps)
  validation.positive_int("total_steps", total_steps, optional=True)
  if not 0.0 < decay_fraction <= 1.0:
    raise ValueError(f"decay_fraction must be in (0, 1], got "
                     f"{decay_fraction}.")
