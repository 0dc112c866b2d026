"""Local stand-ins for the repositories Bazel 4 downloads for `bazel test`.

Bazel 4's built-in WORKSPACE suffix declares @rules_cc, @rules_java and
@remote_coverage_tools as http_archives, only if the WORKSPACE has not
declared them already. Even a pure-Python test needs all three: @bazel_tools'
BUILD files load cc and java rules from the first two, and every test rule
has implicit coverage tool attributes that point at the third. With no
network, each fetch fails and the build stops.

Bazel 4 still has every one of these rules built in, so the stand-ins are
small: defs.bzl files that forward to `native`, and empty coverage
filegroups (coverage is not supported offline).
"""

_CC_RULES = [
    "cc_binary",
    "cc_import",
    "cc_library",
    "cc_proto_library",
    "cc_test",
    "cc_toolchain",
    "cc_toolchain_suite",
    "objc_library",
]

_JAVA_RULES = [
    "java_binary",
    "java_import",
    "java_library",
    "java_lite_proto_library",
    "java_package_configuration",
    "java_plugin",
    "java_proto_library",
    "java_runtime",
    "java_test",
    "java_toolchain",
]

def _forwarding_defs(rules):
    """A defs.bzl body that re-exports Bazel's native `rules` under their names."""
    return "".join(["%s = native.%s\n" % (rule, rule) for rule in rules])

def _local_files_impl(repository_ctx):
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)
    for path, content in repository_ctx.attr.files.items():
        repository_ctx.file(path, content)

_local_files = repository_rule(
    implementation = _local_files_impl,
    attrs = {"files": attr.string_dict(doc = "Path in the repository -> file content.")},
    doc = "A repository made of the given files, written locally; nothing is downloaded.",
)

def offline_repositories():
    """Declares the stand-ins. Call from WORKSPACE before anything else."""
    _local_files(
        name = "rules_cc",
        files = {
            "BUILD": "",
            "cc/BUILD": """\
alias(
    name = "toolchain_type",
    actual = "@bazel_tools//tools/cpp:toolchain_type",
    visibility = ["//visibility:public"],
)
""",
            "cc/defs.bzl": _forwarding_defs(_CC_RULES),
        },
    )
    _local_files(
        name = "rules_java",
        files = {
            "BUILD": "",
            "java/BUILD": "",
            "java/defs.bzl": _forwarding_defs(_JAVA_RULES),
        },
    )
    _local_files(
        name = "remote_coverage_tools",
        files = {
            "BUILD": """\
filegroup(
    name = "coverage_report_generator",
    visibility = ["//visibility:public"],
)

filegroup(
    name = "lcov_merger",
    visibility = ["//visibility:public"],
)
""",
        },
    )
