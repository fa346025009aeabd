"""A YAML reader for untrusted input files: bounded, strict, one-line errors.

PyYAML's ``safe_load`` builds only plain objects, but it still

* expands aliases without limit (a "billion laughs" file of a few hundred bytes stands for
  billions of values, which every later step -- validation, sweep expansion, JSON -- walks);
* lets the last of two equal keys win silently;
* recurses once per nesting level (a deep file ends in ``RecursionError``);
* reads ``1e9`` as the string ``"1e9"`` (YAML 1.1 wants ``1.0e+9``), which a strict number
  field then refuses.

:func:`read_yaml_file` and :func:`parse_yaml` refuse the first three with a
:class:`~simulator.errors.ConfigError` and read ``1e9`` as a float (as YAML 1.2 does).
:func:`read_bounded` reads only regular files up to :data:`MAX_FILE_BYTES` (a FIFO, a
device such as ``/dev/zero`` or a 10 GB file is refused before it is read).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import ConfigError

#: Largest input file read (workloads, topologies, sweeps, suites are a few KiB).
MAX_FILE_BYTES = 4 * 2**20
#: Most values a document may stand for once its aliases are expanded.
MAX_EXPANDED_NODES = 200_000
#: Deepest nesting of lists and mappings.
MAX_DEPTH = 32


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 exponent floats."""

    def construct_mapping(self, node, deep=False):  # noqa: D102
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first is not None:
                raise ConfigError(
                    f"malformed YAML: line {key_node.start_mark.line + 1}: duplicate key "
                    f"{_short(key)} (first at line {first + 1}; each key once)"
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 floats that YAML 1.1 reads as strings: 1e9, 2.5E-3, 300.0e9 (no dot or no sign).
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _short(value: Any, n: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _check_size(root: yaml.Node) -> None:
    """Refuse a composed document that expands to too many values or nests too deeply."""
    sizes: dict[int, int] = {}
    # Iterative post-order walk; an alias is the same node object, so it is sized once but
    # counted every time it is used.
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"malformed YAML: line {node.start_mark.line + 1}: nested deeper than "
                f"{MAX_DEPTH} levels"
            )
        if id(node) in sizes:
            continue
        children = _children(node)
        if done or not children:
            total = 1 + sum(sizes.get(id(c), 1) for c in children)
            if total > MAX_EXPANDED_NODES:
                raise ConfigError(
                    f"malformed YAML: the document stands for over {MAX_EXPANDED_NODES:,} "
                    "values once its aliases are expanded (refused)"
                )
            sizes[id(node)] = total
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


#: PyYAML's loader for the package's own data files, in C (libyaml) where PyYAML was built
#: with it: the same documents, parsed ~10x faster (the GPU catalog: 47 ms -> 5 ms).
_PACKAGE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_package_yaml(path: str | Path) -> Any:
    """One of the package's own YAML files (the GPU catalog, the fabric constants): trusted,
    so parsed as PyYAML's ``safe_load`` would, without the input checks above."""
    with open(path) as fh:
        return yaml.load(fh, Loader=_PACKAGE_LOADER)


def parse_yaml(text: str) -> Any:
    """Parse one YAML document (see the module docstring); raises ``yaml.YAMLError`` for bad
    syntax and :class:`ConfigError` for the refused hazards (without a file name)."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(f"malformed YAML: nested deeper than {MAX_DEPTH} levels") from None
        if node is None:
            return None
        _check_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_bounded(
    path: str | Path, *, what: str = "file", limit: int = MAX_FILE_BYTES, kind: str = "YAML"
) -> str:
    """The text of a regular file of at most ``limit`` bytes, or a one-line ConfigError
    (``kind``: what the file should hold, for the message)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what} does not exist", file=str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", file=str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} is a directory, expected a {kind} file", file=str(path))
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} is not a regular file (a device, FIFO or socket)",
                          file=str(path))
    if st.st_size > limit:
        raise ConfigError(
            f"{what} is larger than {limit:,} bytes ({st.st_size:,} bytes; inputs are small "
            "YAML files)",
            file=str(path),
        )
    try:
        # O_NONBLOCK: a file swapped for a FIFO after the check still cannot block the read.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", file=str(path)) from None
    if len(data) > limit:
        raise ConfigError(f"{what} is larger than {limit:,} bytes (refused)", file=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})",
            file=str(path),
        ) from None
