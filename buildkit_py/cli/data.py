"""imgbuild data status|refresh: the shipped compatibility data and the look-up cache."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, index_options, json_option, progress_option
from buildkit_py.cli.progress import Activity
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import UsageError
from buildkit_py.sizes import human_size

if TYPE_CHECKING:
    import datetime


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


def cmd_data(args: argparse.Namespace, out: Out) -> int:
    import datetime

    from buildkit_py.compat import tables
    from buildkit_py.pipeline import lookups as live

    if args.data_command == "refresh":
        return cmd_data_refresh(args, out)
    if args.data_command != "status":
        raise UsageError("imgbuild data: say status or refresh", hint="see `imgbuild data --help`")
    as_of = tables.data_files_as_of()
    shipped = max((d for d in as_of.values() if d), default=None)
    cache_folder = settings_of(args).compat_cache
    cached = live.cached_rows(cache_folder)
    rows = [{"component": "torch", "version": v, "index": r.get("index"), "read": r.get("read"),
             "pypi_variant": r.get("pypi_variant"), "shipped": any(t.version == v for t in tables.torch_releases())}
            for v, r in sorted(cached.items())]
    cache = str(cache_folder)
    images = _images_status(datetime.date.today())
    partial = {"torch": [r.version for r in tables.torch_releases() if r.partial],
               "flash-attn": [r.version for r in tables.flash_attn_releases() if r.partial],
               "bitsandbytes": [r.version for r in tables.bitsandbytes_releases() if r.partial]}
    report = {"shipped_as_of": shipped, "files": as_of, "cache": cache, "cached": rows, "images": images,
              "partial": partial}
    if args.json:
        out.data(report)
        return 0
    out.line(f"shipped compatibility data as of {shipped or 'unknown'}")
    for name, date in as_of.items():
        out.line(f"  {name:<20} {date or '-'}")
    past = [r for r in images["end_of_life"] if r["past"]]
    newest = f" (newest: {past[-1]['cuda']}, {past[-1]['date']})" if past else ""
    out.line(f"nvidia/cuda images: {images['releases']} releases, {len(past)} past NVIDIA's end of life on "
             f"{images['today']}{newest}")
    coming = [f"{r['cuda']} ({r['date']})" for r in images["end_of_life"] if not r["past"]]
    if coming:
        out.line(f"  end of life ahead: {', '.join(coming)}")
    if images["end_of_life_unknown"]:
        out.line(f"  end of life, no date: {', '.join(images['end_of_life_unknown'])}")
    out.line(f"  no end-of-life date published: {', '.join(images['no_end_of_life']) or '-'}")
    if images["policy"]:
        out.line(f"  policy: {images['policy']}")
    # rows known only in part: a plan that needs what they lack says "unknown" and refuses
    for component, versions in partial.items():
        if versions:
            out.line(f"known only in part: {component} {', '.join(versions)}")
    if not cached:
        out.line(f"look-up cache ({cache}): empty")
    else:
        out.line(f"look-up cache ({cache}) adds:")
        for c in rows:
            out.line(f"  torch {c['version']:<9} {c['pypi_variant'] or '?':<6} from {c['index']} (read {c['read']})"
                     + ("  [now also shipped]" if c["shipped"] else ""))
    return 0


def _images_status(today: datetime.date) -> dict[str, Any]:  # `data status` JSON: its images part
    """The nvidia/cuda releases images.json records and where each stands in NVIDIA's support policy."""
    from buildkit_py.compat import tables

    releases = tables.image_releases()
    eols = [{"cuda": i.cuda, "date": str(i.end_of_life.date), "basis": i.end_of_life.basis,
             "deletion": str(i.end_of_life.deletion) if i.end_of_life.deletion else None,
             "past": today >= i.end_of_life.date}
            for i in releases if i.end_of_life is not None]
    return {"today": str(today), "releases": len(releases), "policy": tables.image_support_policy().get("summary"),
            "end_of_life": eols,
            "end_of_life_unknown": [i.cuda for i in releases if i.end_of_life_unknown],
            "no_end_of_life": [i.cuda for i in releases if i.end_of_life is None and not i.end_of_life_unknown]}


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
    if args.json:
        out.data({**report.to_json(), "written": written,
                  "requests": client.requests, "bytes_read": client.bytes_read})
        return 0
    for c in report.changes:
        out.line(c.render())
    for r in report.review:
        out.line(f"review: {r}")
    if not report.changes:
        out.line("the data matches the index")
    out.info(f"{client.requests} requests, {human_size(client.bytes_read)} read"
             + (f"; wrote {', '.join(written)}" if written else
                ("; nothing written (use --write)" if texts and not args.write else "")))
    return 0
