"""imgbuild data status|refresh: the shipped compatibility data and the look-up cache."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, index_options, json_option, progress_option
from buildkit_py.cli.progress import Activity
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import UsageError
from buildkit_py.sizes import human_size

if TYPE_CHECKING:
    import datetime

    from buildkit_py.compat.refresh import RefreshReport


def register(add: AddCommand) -> None:
    d = add("data", "imgbuild's compatibility data (CUDA toolkits and drivers, torch, flash-attn, bitsandbytes,\n"
            "images) ships with it, each row with its source and the date read. `data status` prints the\n"
            "shipped data's date and the releases the plan-time look-up cached since; `data refresh`\n"
            "re-reads what the package index serves (release lists, wheel METADATA, the CUDA libraries in\n"
            "bitsandbytes wheels) and shows or --write s the changes, every flash-attn and bitsandbytes\n"
            "release the data lacks included. The index is the one pip would use: --index-url,\n"
            "PIP_INDEX_URL, --pip-config, pip's config files, else PyPI.")
    dsub = d.add_subparsers(dest="data_command", metavar="ACTION", parser_class=type(d))
    ds = dsub.add_parser("status", help="the shipped data's date and what the look-up cache adds", epilog=d.epilog)
    json_option(ds)
    dr = dsub.add_parser("refresh", help="compare the data with the package index; --write to update the files",
                         epilog=d.epilog)
    dr.add_argument("--write", action="store_true", help="write the changed data files (default: only show them)")
    dr.add_argument("--data-dir", type=Path, default=None, help="data files to update (default: the installed ones)")
    dr.add_argument("--flash-attn-repo", type=Path, default=None, metavar="PATH",
                    help="a clone (or bare mirror) of Dao-AILab/flash-attention: flash-attn releases are filled from "
                         "their tags (publish.yml wheel matrix, setup.py, README); without it a release the data "
                         "lacks is added as a partial row")
    json_option(dr)
    index_options(dr)
    progress_option(dr, "what is being read")
    d.set_defaults(handler=cmd_data)


@dataclass(frozen=True)
class CachedRelease:
    """A torch release the plan-time look-up cached (`data status`'s ``cached`` rows)."""

    version: str
    index: str | None
    read: str | None
    pypi_variant: str | None
    shipped: bool  # the shipped data has it now too

    def to_json(self) -> dict[str, Any]:
        return {"component": "torch", "version": self.version, "index": self.index, "read": self.read,
                "pypi_variant": self.pypi_variant, "shipped": self.shipped}

    def line(self) -> str:
        return (f"  torch {self.version:<9} {self.pypi_variant or '?':<6} from {self.index} (read {self.read})"
                + ("  [now also shipped]" if self.shipped else ""))


@dataclass(frozen=True)
class ImageEndOfLife:
    """One nvidia/cuda release's end of life as images.json records it, and whether today is past it."""

    cuda: str
    date: str
    basis: str
    deletion: str | None
    past: bool

    def to_json(self) -> dict[str, Any]:
        return {"cuda": self.cuda, "date": self.date, "basis": self.basis, "deletion": self.deletion,
                "past": self.past}


@dataclass(frozen=True)
class ImagesStatus:
    """The nvidia/cuda releases images.json records and where each stands in NVIDIA's support policy."""

    today: str
    releases: int
    policy: str | None
    end_of_life: tuple[ImageEndOfLife, ...]
    end_of_life_unknown: tuple[str, ...]
    no_end_of_life: tuple[str, ...]

    @classmethod
    def on(cls, today: datetime.date) -> ImagesStatus:
        from buildkit_py.compat import images

        releases = images.image_releases()
        eols = tuple(ImageEndOfLife(i.cuda, str(i.end_of_life.date), i.end_of_life.basis,
                                    str(i.end_of_life.deletion) if i.end_of_life.deletion else None,
                                    today >= i.end_of_life.date)
                     for i in releases if i.end_of_life is not None)
        return cls(str(today), len(releases), images.image_support_policy().get("summary"), eols,
                   tuple(i.cuda for i in releases if i.end_of_life_unknown),
                   tuple(i.cuda for i in releases if i.end_of_life is None and not i.end_of_life_unknown))

    def to_json(self) -> dict[str, Any]:
        return {"today": self.today, "releases": self.releases, "policy": self.policy,
                "end_of_life": [e.to_json() for e in self.end_of_life],
                "end_of_life_unknown": list(self.end_of_life_unknown), "no_end_of_life": list(self.no_end_of_life)}

    def lines(self) -> list[str]:
        past = [e for e in self.end_of_life if e.past]
        newest = f" (newest: {past[-1].cuda}, {past[-1].date})" if past else ""
        lines = [f"nvidia/cuda images: {self.releases} releases, {len(past)} past NVIDIA's end of life on "
                 f"{self.today}{newest}"]
        coming = [f"{e.cuda} ({e.date})" for e in self.end_of_life if not e.past]
        if coming:
            lines.append(f"  end of life ahead: {', '.join(coming)}")
        if self.end_of_life_unknown:
            lines.append(f"  end of life, no date: {', '.join(self.end_of_life_unknown)}")
        lines.append(f"  no end-of-life date published: {', '.join(self.no_end_of_life) or '-'}")
        if self.policy:
            lines.append(f"  policy: {self.policy}")
        return lines


@dataclass(frozen=True)
class DataStatus:
    """`data status`: the shipped data's dates, the images' end of life, the rows known only in part
    and what the look-up cache adds."""

    shipped_as_of: str | None
    files: Mapping[str, str | None]  # data file -> its "as of" date
    cache: str
    cached: tuple[CachedRelease, ...]
    images: ImagesStatus
    partial: Mapping[str, tuple[str, ...]]  # component -> versions known only in part

    def to_json(self) -> dict[str, Any]:
        return {"shipped_as_of": self.shipped_as_of, "files": dict(self.files), "cache": self.cache,
                "cached": [c.to_json() for c in self.cached], "images": self.images.to_json(),
                "partial": {component: list(versions) for component, versions in self.partial.items()}}

    def lines(self) -> list[str]:
        lines = [f"shipped compatibility data as of {self.shipped_as_of or 'unknown'}"]
        lines += [f"  {name:<20} {date or '-'}" for name, date in self.files.items()]
        lines += self.images.lines()
        # rows known only in part: a plan that needs what they lack says "unknown" and refuses
        lines += [f"known only in part: {component} {', '.join(versions)}"
                  for component, versions in self.partial.items() if versions]
        if not self.cached:
            return [*lines, f"look-up cache ({self.cache}): empty"]
        return [*lines, f"look-up cache ({self.cache}) adds:", *(c.line() for c in self.cached)]


def cmd_data(args: argparse.Namespace, out: Out) -> int:
    import datetime

    from buildkit_py.compat import bitsandbytes, flash_attn, tables, torch_data
    from buildkit_py.pipeline import lookups as live

    if args.data_command == "refresh":
        return cmd_data_refresh(args, out)
    if args.data_command != "status":
        raise UsageError("imgbuild data: say status or refresh", hint="see `imgbuild data --help`")
    as_of = tables.data_files_as_of()
    cache_folder = settings_of(args).compat_cache
    cached = tuple(CachedRelease(v, r.get("index"), r.get("read"), r.get("pypi_variant"),
                                 any(t.version == v for t in torch_data.torch_releases()))
                   for v, r in sorted(live.cached_rows(cache_folder).items()))
    partial = {"torch": tuple(r.version for r in torch_data.torch_releases() if r.partial),
               "flash-attn": tuple(r.version for r in flash_attn.flash_attn_releases() if r.partial),
               "bitsandbytes": tuple(r.version for r in bitsandbytes.bitsandbytes_releases() if r.partial)}
    status = DataStatus(max((d for d in as_of.values() if d), default=None), as_of, str(cache_folder), cached,
                        ImagesStatus.on(datetime.date.today()), partial)
    out.document(status, as_json=args.json)
    return 0


def cmd_data_refresh(args: argparse.Namespace, out: Out) -> int:
    import datetime

    from buildkit_py.compat import index, refresh, tables

    settings = index.index_settings(index_url=args.index_url, env=settings_of(args).environ,
                                    pip_config=str(args.pip_config) if args.pip_config else None)
    out.info(f"reading {index.redact(settings.url)} (from {settings.source})")
    client = index.client_for(settings)
    data = {name: json.loads(tables.data_dir().joinpath(name).read_text(encoding="utf-8"))
            for name in tables.DATA_FILES}
    with Activity.for_option(out.stderr, args.progress) as activity:
        report = refresh.refresh(client, data, today=datetime.date.today().isoformat(),
                                 flash_attn_repo=args.flash_attn_repo, on_status=activity)
    texts = {name: refresh.dump(raw) for name, raw in report.files.items()}
    written: list[str] = []
    if texts:
        refresh.validate_files(texts)
    if args.write and texts:
        written = refresh.write_files(texts, args.data_dir or tables.data_dir())
    refreshed = DataRefreshed(report, tuple(written), client.requests, client.bytes_read)
    out.document(refreshed, as_json=args.json)
    if not args.json:
        out.info(f"{refreshed.requests} requests, {human_size(refreshed.bytes_read)} read"
                 + (f"; wrote {', '.join(written)}" if written else
                    ("; nothing written (use --write)" if texts and not args.write else "")))
    return 0


@dataclass(frozen=True)
class DataRefreshed:
    """`data refresh`: what the package index changes in the data, what was written, what it cost."""

    report: RefreshReport
    written: tuple[str, ...]  # data files written (--write)
    requests: int
    bytes_read: int

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "written": list(self.written), "requests": self.requests,
                "bytes_read": self.bytes_read}

    def lines(self) -> list[str]:
        lines = [c.render() for c in self.report.changes] + [f"review: {r}" for r in self.report.review]
        return lines if self.report.changes else [*lines, "the data matches the index"]
