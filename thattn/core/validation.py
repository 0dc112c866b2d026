"""Argument checks shared by every layer of the package.

Each check raises a `ValueError` that names the argument, the value it got
and what was expected, and returns the value so that a constructor can check
and store in one line:

    self.num_heads = validation.positive_int("num_heads", num_heads)

`owner` (a class or config name) is prefixed to the message when the
argument's name alone would not say where it came from.
"""


def _prefix(owner):
  return f"{owner}: " if owner else ""


def positive_int(name, value, *, owner=None, optional=False):
  """`value` if it is an int > 0 (not a bool); None too if `optional`."""
  if optional and value is None:
    return value
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"{_prefix(owner)}{name} must be a positive integer, "
                     f"got {value!r}.")
  return value


def layer_int(name, value, *, owner=None, optional=False):
  """`positive_int` for a layer's constructor argument, worded as Keras 3's
  layers word it ("Received an invalid value for argument `num_heads`..."),
  so code matching Keras's messages matches thattn's too."""
  if optional and value is None:
    return value
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    expected = "a positive integer" + (" or `None`" if optional else "")
    raise ValueError(
        f"{_prefix(owner)}Received an invalid value for argument `{name}`, "
        f"expected {expected}. Received: {name}={value!r}")
  return value


def non_negative_int(name, value, *, owner=None):
  """`value` if it is an int >= 0 (not a bool)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f"{_prefix(owner)}{name} must be an integer >= 0, got "
                     f"{value!r}.")
  return value


def one_of(name, value, choices, *, owner=None):
  """`value` if it is one of `choices`; the error lists them all."""
  if value not in choices:
    unknown = f"{owner}: unknown" if owner else "Unknown"
    raise ValueError(f"{unknown} {name} {value!r}; expected one of "
                     f"{', '.join(repr(c) for c in choices)}.")
  return value


def rate(name, value, *, owner=None):
  """`value` if it is a number in [0, 1) (a dropout or masking rate)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
      0.0 <= value < 1.0):
    raise ValueError(f"{_prefix(owner)}{name} must be in [0, 1), got "
                     f"{value!r}.")
  return value
