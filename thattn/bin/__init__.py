"""The absl binaries: thattn-train, -export, -ablate and -complexity.

The only modules of the package that define flags. Each parses its flags,
builds options and calls one keyword-only library function.
"""
