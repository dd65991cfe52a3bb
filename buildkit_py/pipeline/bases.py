"""The base image's facts read from its registry (manifest and config only, no layers), and the
resolution against them: the pipeline's only registry I/O before a build.

A base that cannot be read stops the plan with the registry's own reason, before any rule
guesses at what the base might be: a missing tag or repository is the recipe's error at the
key that names it (exit 2); credentials the registry refuses, or a registry out of reach, are
the environment's (exit 3)."""

from __future__ import annotations

import dataclasses
import datetime

from buildkit_py import oci
from buildkit_py.compat.bases import BaseFacts, needs_lookup
from buildkit_py.compat.resolve import Resolution, resolve
from buildkit_py.compat.rules import LookedUp, mirrored_ref
from buildkit_py.errors import (
    AuthenticationError,
    BaseImageNotFound,
    ManifestNotFound,
    RecipeIssue,
    RegistryError,
    RegistryUnreachable,
    SignatureError,
)
from buildkit_py.plan.build_plan import BuildPlan
from buildkit_py.recipe.model import Recipe


def fetch_base_facts(ref: str, *, client: oci.Client | None = None) -> BaseFacts:
    """The base's digest, labels and env. Raises the registry's typed error when it cannot be
    read (ManifestNotFound, AuthenticationError, RegistryUnreachable, RegistryError)."""
    # Planning must not stall on an unreachable registry: one short try.
    client = client or oci.Client(timeout=(5.0, 5.0), max_retries=1)
    found = oci.read_any_manifest(ref, client=client)
    image = oci.read_image_config(ref, client=client, manifest=found if isinstance(found, oci.Manifest) else None)
    env = dict(e.split("=", 1) for e in image.runtime.get("Env") or [] if "=" in e)
    if isinstance(found, oci.Index):  # the platforms it serves (compat/platforms.py checks the recipe's)
        platforms = tuple(dict.fromkeys(p for p in (e.platform_name for e in found.manifests) if "unknown" not in p))
    else:
        document = image.document()
        platforms = (f"{document.get('os', 'linux')}/{document['architecture']}",) if document.get("architecture") \
            else ()
    return BaseFacts(ref, found.digest, dict(image.labels), env, platforms)


def base_facts_for(recipe: Recipe, base_image: str, *, client: oci.Client | None = None) -> BaseFacts | None:
    """The facts of the final stage's base where it is looked up (compat.bases.needs_lookup), else
    None. A base that cannot be read raises the registry's reason, located at the recipe's key."""
    if not needs_lookup(recipe, base_image):
        return None
    key = "base.mirror" if recipe.base.mirror else "base.image"
    where = f"{recipe.path}:{recipe.line_of(key)}" if recipe.line_of(key) else str(recipe.path)
    try:
        return fetch_base_facts(base_image, client=client)
    except ManifestNotFound as exc:
        raise BaseImageNotFound([RecipeIssue(
            str(recipe.path), recipe.line_of(key), key,
            f"the base image {base_image} is not in its registry ({_registry_words(exc.message)})")],
            hint=_missing_hint(recipe, base_image)) from None
    except (AuthenticationError, RegistryUnreachable) as exc:
        # exit 3, as the registry's own error; the recipe key says which image was being read.
        raise type(exc)(f"cannot read the base image {base_image} ({where}: {key}): {exc.message}",
                        hint=exc.hint) from None
    except RegistryError as exc:
        raise RegistryError(f"cannot read the base image {base_image} ({where}: {key}): {exc.message}",
                            hint=exc.hint) from None


def _registry_words(message: str) -> str:
    """The registry's own words from a ManifestNotFound (``... [MANIFEST_UNKNOWN: ...]``)."""
    start, end = message.rfind("["), message.rfind("]")
    return message[start + 1:end] if 0 <= start < end else message


def _missing_hint(recipe: Recipe, base_image: str) -> str:
    if recipe.base.mirror:
        upstream = recipe.base.image or base_image.removeprefix(recipe.base.mirror.rstrip("/") + "/")
        return (f"copy it into the mirror first: imgbuild mirror {upstream} --to-mirror {recipe.base.mirror}; "
                "or check the tag")
    return "check the repository and tag (a shared base must be pushed before recipes build on it)"


def resolve_with_base(recipe: Recipe, *, client: oci.Client | None = None,
                      cache: dict[str, BaseFacts | None] | None = None,
                      looked_up: LookedUp | None = None, today: datetime.date) -> Resolution:
    """Resolve against the final base's own facts (labels, env) when it is looked up: a shared
    base built by imgbuild says its OS and Python in its labels. Every command that resolves a
    recipe (plan, build, matrix, lock) goes through here. ``cache`` (base ref -> facts) lets a
    matrix look each base up once; ``looked_up``: the facts the plan-time look-up found; ``today``:
    the date the resolution is made on (the pipeline reads the clock, the resolver does not)."""
    looked_up = looked_up or LookedUp()
    if recipe.base.image:
        base_ref = mirrored_ref(recipe.base.image, recipe.base.mirror)
    elif recipe.base.mirror:
        base_ref = resolve(recipe, looked_up=looked_up, today=today).base_image  # an nvidia/cuda tag under the mirror
    else:
        return resolve(recipe, looked_up=looked_up, today=today)  # nvidia/cuda on Docker Hub: nothing to look up
    if cache is not None and base_ref in cache:
        facts = cache[base_ref]
    else:
        facts = base_facts_for(recipe, base_ref, client=client)
        if cache is not None:
            cache[base_ref] = facts
    return resolve(recipe, base=facts, looked_up=looked_up, today=today)



def verify_base(plan: BuildPlan, *, client: oci.Client | None = None) -> BuildPlan:
    """base.verify, before anything is built: the final base must carry a cosign signature that
    verifies under the recipe's public key, else SignatureError naming the base and the key.
    The plan names the base by the digest its registry gave at plan time, and that digest is
    what is verified; a base named by tag alone is pinned to the digest verified here, so the
    engine cannot pull another image should the tag move between this check and the build."""
    key_path = plan.recipe.base.verify
    if key_path is None:
        return plan
    from buildkit_py.oci.signatures import load_verifying_key, verify_image  # noqa: PLC0415

    recipe = plan.recipe
    where = f"{recipe.path}:{recipe.line_of('base.verify')}" if recipe.line_of("base.verify") else str(recipe.path)
    base = plan.final.base
    key = load_verifying_key(key_path, f"base.verify ({where})")
    verdict = verify_image(base, key, client=client)[0]
    if not verdict.verified:
        raise SignatureError(f"the base image {base.split('@', 1)[0]} ({verdict.digest}) is not signed by {key_path} "
                             f"({where}: base.verify): {verdict.reason}",
                             hint="build on the base its publisher signed (`imgbuild verify BASE --key KEY.pub` "
                                  "checks one), or ask them to sign it: imgbuild sign BASE --key THEIR_KEY")
    pinned = base if "@" in base else f"{base}@{verdict.digest}"
    stages = tuple(dataclasses.replace(s, base=pinned) if s.base == base else s for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)
