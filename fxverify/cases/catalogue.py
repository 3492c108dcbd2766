"""The model catalogue: corpus entries as plain data, and selection over them.

Entries come from the TOML files of ``corpus/`` (shipped as ``fxverify.corpus``:
``models.toml`` the default zoo, ``edge.toml`` the FX edge cases, ``layers.toml``
the layer variants, ``full.toml`` the generated full zoo) and from :func:`register_model`.
Nothing here imports torch, so the pytest plugin can collect items cheaply.

>>> [e.name for e in select("resnet18")]
['resnet18']
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Any

import tomllib

from fxverify.core.captures import DEFAULT_CAPTURE, capture_names
from fxverify.errors import CorpusError

SOURCES = ("torchvision", "timm", "edge", "user")
TRACERS = ("plain", "timm")  # or "module:TracerClass", a torch.fx.Tracer subclass
DTYPES = ("float32", "bfloat16")  # a model's dtype: its floating parameters, buffers and inputs
# an input's memory format (torch's names), and the number of dimensions each other than contiguous_format needs
MEMORY_FORMATS = {"contiguous_format": None, "channels_last": 4, "channels_last_3d": 5}


def model_label(model: str, capture: str) -> str:
    """``model`` under ``capture`` in item ids, the summary and reports: the name alone under the
    default capture, else ``model@capture``.

    >>> model_label("resnet18", "symbolic_trace"), model_label("resnet18", "export")
    ('resnet18', 'resnet18@export')
    """
    return model if capture == DEFAULT_CAPTURE else f"{model}@{capture}"


def file_label(model: str, capture: str) -> str:
    """``model`` under ``capture`` in file names (golden files, repros): the name alone under the default
    capture, else ``model.capture``.

    >>> file_label("resnet18", "symbolic_trace"), file_label("resnet18", "export_core")
    ('resnet18', 'resnet18.export_core')
    """
    return model if capture == DEFAULT_CAPTURE else f"{model}.{capture}"


def split_label(label: str) -> tuple[str, str]:
    """``(model, capture)`` of a :func:`model_label`.

    >>> split_label("resnet18@export"), split_label("resnet18")
    (('resnet18', 'export'), ('resnet18', 'symbolic_trace'))
    """
    model, _, capture = label.partition("@")
    return model, capture or DEFAULT_CAPTURE


CATALOGUE_FILES = ("models.toml", "edge.toml", "layers.toml", "full.toml")
NONE = "None"  # TOML has no null: this string stands for None in concrete_args
RANDOM_GRAPH_TAG = "random_graph"  # the tag of drawn graphs (fxverify.strategies): no stable golden file


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One positional input: its shape (batch first), dtype and memory format.

    ``low`` / ``high`` bound the values drawn (integer inputs need them). On a floating input they declare
    the model's domain (a quantized model's calibration range): the large-magnitude input set leaves it as drawn.
    ``memory_format`` (one of :data:`MEMORY_FORMATS`, torch's names: ``"channels_last"`` for a 4-D input,
    ``"channels_last_3d"`` for a 5-D one) is the layout of the tensors drawn, the same values in those strides, in
    every configuration of the input (other batch and spatial sizes, the float64 and device copies).

    >>> InputSpec((2, 3, 8), memory_format="channels_last")
    Traceback (most recent call last):
    ...
    fxverify.errors.CorpusError: input of shape (2, 3, 8): memory_format='channels_last' needs a 4-D shape
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float | None = None
    high: float | None = None
    memory_format: str = "contiguous_format"

    def __post_init__(self) -> None:
        if self.memory_format not in MEMORY_FORMATS:
            raise CorpusError(f"input of shape {self.shape}: memory_format must be one of {tuple(MEMORY_FORMATS)}, "
                              f"got memory_format={self.memory_format!r}")
        rank = MEMORY_FORMATS[self.memory_format]
        if rank is not None and len(self.shape) != rank:
            raise CorpusError(f"input of shape {self.shape}: memory_format={self.memory_format!r} needs a {rank}-D "
                              f"shape")

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> InputSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CorpusError(f"input {dict(data)}: unknown fields {unknown}; known: {sorted(known)}")
        return cls(
            shape=tuple(int(d) for d in data["shape"]),
            dtype=str(data.get("dtype", "float32")),
            low=data.get("low"),
            high=data.get("high"),
            memory_format=str(data.get("memory_format", "contiguous_format")),
        )


@dataclasses.dataclass(frozen=True)
class CorpusEntry:
    """A model the checks run on.

    ``factory`` is ``"module:attr"`` or a callable returning a fresh
    ``nn.Module``; for torchvision and timm entries it defaults to the model
    name, built with random init (``weights=None`` / ``pretrained=False``).
    ``dtype`` (one of :data:`DTYPES`) is the model's: its floating parameters and buffers, and
    every floating input, are cast to it (the float64 reference is the same model in float64); None
    (the default): the model as its factory builds it and each input in its own dtype.

    >>> entry = CorpusEntry(name="tiny", source="user", factory="torch.nn:Identity",
    ...                     inputs=(InputSpec((2, 3)),))
    >>> entry.primary_batch
    2
    """

    name: str
    source: str
    inputs: tuple[InputSpec, ...]
    factory: str | Callable[[], Any] | None = None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batch_sizes: tuple[int, ...] = (1, 2)
    spatial_sizes: tuple[tuple[int, ...], ...] = ()
    tracer: str = "plain"
    concrete_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tags: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ("default",)
    rtol: float | None = None
    atol: float | None = None
    tolerance_reason: str | None = None
    xfail: str | None = None
    capture_xfail: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dtype: str | None = None

    def __post_init__(self) -> None:
        where = f"corpus entry {self.name!r}"
        if self.source not in SOURCES:
            raise CorpusError(f"{where}: source must be one of {SOURCES}, got source={self.source!r}")
        if self.tracer not in TRACERS and ":" not in self.tracer:
            raise CorpusError(
                f"{where}: tracer must be one of {TRACERS} or 'module:TracerClass', got tracer={self.tracer!r}"
            )
        if not self.inputs:
            raise CorpusError(f"{where}: needs at least one input spec")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise CorpusError(f"{where}: dtype (the model's floating parameters, buffers and inputs) must be one "
                              f"of {DTYPES}, got dtype={self.dtype!r}")
        if self.source in ("edge", "user") and self.factory is None:
            raise CorpusError(f"{where}: a {self.source} entry needs a factory ('module:attr' or a callable)")
        if (self.rtol is not None or self.atol is not None) and not self.tolerance_reason:
            raise CorpusError(f"{where}: a tolerance override needs tolerance_reason saying why")
        unknown = sorted(set(self.capture_xfail) - set(capture_names()[1:]))
        if unknown:
            raise CorpusError(f"{where}: capture_xfail names {unknown}; it takes {list(capture_names()[1:])} "
                              f"(xfail is {DEFAULT_CAPTURE}'s)")

    def expected_failure(self, capture: str) -> str | None:
        """Why the entry is known not to capture or run under ``capture`` (``xfail`` for the default
        capture, ``capture_xfail[capture]`` for the others), or None.

        >>> CorpusEntry(name="t", source="user", factory="torch.nn:Identity", inputs=(InputSpec((2,)),),
        ...             xfail="why").expected_failure("export") is None
        True
        """
        return self.xfail if capture == DEFAULT_CAPTURE else self.capture_xfail.get(capture)

    @property
    def primary_batch(self) -> int:
        return self.inputs[0].shape[0]

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CorpusEntry:
        """Build an entry from one ``[[model]]`` table of the TOML catalogue."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CorpusError(f"corpus entry {data.get('name')!r}: unknown fields {unknown}; known: {sorted(known)}")
        fields = dict(data)
        try:
            fields["inputs"] = tuple(InputSpec.from_data(i) for i in data.get("inputs", ()))
        except CorpusError as error:
            raise CorpusError(f"corpus entry {data.get('name')!r}: {error}") from None
        fields["spatial_sizes"] = tuple(tuple(s) for s in data.get("spatial_sizes", ()))
        if "concrete_args" in data:
            fields["concrete_args"] = {k: None if v == NONE else v for k, v in data["concrete_args"].items()}
        for name in ("batch_sizes", "tags", "profiles"):
            if name in data:
                fields[name] = tuple(data[name])
        return cls(**fields)


@functools.cache
def catalogue() -> tuple[CorpusEntry, ...]:
    """The shipped catalogue, in file order (``CATALOGUE_FILES``, then entries within a file)."""
    folder = resources.files("fxverify.corpus")
    entries: list[CorpusEntry] = []
    for filename in CATALOGUE_FILES:
        path = folder.joinpath(filename)
        if path.is_file():
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            entries.extend(CorpusEntry.from_data(m) for m in data.get("model", []))
    _check_unique(entries)
    return tuple(entries)


_registered: dict[str, CorpusEntry] = {}


def register_model(entry: CorpusEntry) -> CorpusEntry:
    """Add a model of your own to the corpus (a ``user`` entry).

    It then takes part in selections like any shipped entry, by profile
    (``default`` unless ``profiles`` says otherwise), name or glob::

        register_model(CorpusEntry(name="my_net", source="user", factory="my_pkg.models:MyNet",
                                   inputs=(InputSpec((2, 3, 32, 32)),)))
    """
    if any(e.name == entry.name for e in catalogue()):
        raise CorpusError(f"corpus entry {entry.name!r} already exists in the shipped catalogue; pick another name")
    _registered[entry.name] = entry
    return entry


def all_entries() -> tuple[CorpusEntry, ...]:
    """Shipped entries followed by registered ones."""
    return catalogue() + tuple(_registered.values())


def profiles(entries: Iterable[CorpusEntry] | None = None) -> list[str]:
    """Every profile name some entry belongs to, sorted."""
    return sorted({p for e in (entries or all_entries()) for p in e.profiles})


def select(
    selection: str | Iterable[str],
    *,
    exclude: str | Iterable[str] = (),
    tags: str | Iterable[str] = (),
) -> list[CorpusEntry]:
    """Entries matching a comma-separated selection of profiles, names and globs,
    less those matching ``exclude`` (same syntax), keeping only entries carrying
    at least one of ``tags`` when given.

    Order follows the catalogue, whatever the order of the selection.

    >>> [e.name for e in select("resnet*")][:1]
    ['resnet18']
    >>> [e.name for e in select("default", exclude="*", tags="")]
    []
    """
    tokens = _tokens(selection)
    if not tokens:
        raise CorpusError("empty corpus selection; name a profile (e.g. 'default'), a model or a glob")
    entries = all_entries()
    chosen = set().union(*(_matching(token, entries, "corpus selection") for token in tokens))
    for token in _tokens(exclude):
        chosen -= _matching(token, entries, "corpus exclusion")
    wanted = _tokens(tags)
    if wanted:
        known = {t for e in entries for t in e.tags}
        for tag in wanted:
            if tag not in known:
                hint = _did_you_mean(tag, sorted(known))
                raise CorpusError(f"no corpus entry has the tag {tag!r}.{hint} Tags: {', '.join(sorted(known))}")
        chosen = {e.name for e in entries if e.name in chosen and set(e.tags) & set(wanted)}
    return [e for e in entries if e.name in chosen]


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``, 1 <= I <= N.

    >>> parse_shard("2/4")
    (2, 4)
    """
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or not 1 <= i <= n:
        raise CorpusError(f"shard must be I/N with 1 <= I <= N (for example 1/4), got {text!r}")
    return i, n


def shard(entries: Iterable[CorpusEntry], index: int, count: int) -> list[CorpusEntry]:
    """Shard ``index`` of ``count`` (1-based): every ``count``-th entry in catalogue order.

    The shards partition the entries exactly, differ in size by at most one,
    and depend only on the selection, so they agree across machines and runs.

    >>> [e.name for e in shard(select("resnet18,mobilenet_v2,mobilenet_v3_small"), 2, 2)]
    ['mobilenet_v2']
    """
    return [entry for position, entry in enumerate(entries) if position % count == index - 1]


def choose(corpus: str, *, exclude: str = "", tags: str = "", shard_spec: str = "") -> list[CorpusEntry]:
    """What the pytest options select: :func:`select` then, with ``shard_spec`` "I/N", :func:`shard`."""
    entries = select(corpus, exclude=exclude, tags=tags)
    return shard(entries, *parse_shard(shard_spec)) if shard_spec else entries


def find(name: str) -> CorpusEntry:
    """The entry called ``name``."""
    for entry in all_entries():
        if entry.name == name:
            return entry
    close = difflib.get_close_matches(name, [e.name for e in all_entries()], n=3)
    raise CorpusError(f"no corpus entry named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))


def _tokens(text: str | Iterable[str]) -> list[str]:
    parts = text.split(",") if isinstance(text, str) else text
    return [t.strip() for t in parts if t.strip()]


def _did_you_mean(token: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(token, choices, n=3)
    return f" Did you mean {', '.join(close)}?" if close else ""


def _matching(token: str, entries: tuple[CorpusEntry, ...], what: str) -> set[str]:
    """Names of the entries a profile, name or glob matches; an error naming close matches if none."""
    matched = {e.name for e in entries if token in e.profiles or fnmatch.fnmatchcase(e.name, token)}
    if not matched:
        hint = _did_you_mean(token, profiles(entries) + [e.name for e in entries])
        raise CorpusError(
            f"{what} {token!r} matches no profile, model name or glob.{hint} Profiles: {', '.join(profiles(entries))}"
        )
    return matched


def _check_unique(entries: Iterable[CorpusEntry]) -> None:
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise CorpusError(f"corpus entry {entry.name!r} appears twice in the catalogue")
        seen.add(entry.name)
