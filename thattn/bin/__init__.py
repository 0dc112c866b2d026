"""The absl binaries (console scripts): thattn-train, -export, -ablate, -complexity.

The only modules of the package that define flags. Each parses its flags,
builds options and calls one keyword-only library function.
"""
