"""``SecondaryTierFactory``: build tiers from config dicts.

Mirrors the factory of vLLM's KV-offload tiering layer: tiers are resolved by ``type``
from a registry of *lazy* loaders (module path + class name, imported on first use), and an
out-of-tree tier needs no registration at all — put ``module_path`` in its config. On top
of that:

* a pip-installed package can add a tier with no code at all, through the entry-point group
  ``asynctier.tiers`` (``name = "package.module:ClassName"``);
* a class that is not a :class:`SecondaryTierManager` is a clear error, not an ``assert``;
* an unknown config key is an error that names the parameters the tier accepts;
* the caller's config dict is never modified.

A tier config is code: ``module_path`` is imported (its module runs) before the class is
checked, exactly as a Python ``import`` would. Take configs only from sources you would take
code from (docs/security.md).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar

from .contract import SecondaryTierManager
from .errors import TierConfigError
from .spec import OffloadingSpec

#: Registration is check-then-insert: one lock for it.
_REGISTRY_LOCK = threading.Lock()

__all__ = ["ENTRY_POINT_GROUP", "SecondaryTierFactory", "TierInfo", "accepted_parameters"]

log = logging.getLogger(__name__)

#: Entry-point group through which installed packages add tiers.
ENTRY_POINT_GROUP = "asynctier.tiers"

#: Keys the factory itself consumes; never passed to the tier.
_FACTORY_KEYS = ("type", "module_path")
#: Keyword arguments the factory supplies; not allowed in a config.
_SUPPLIED = ("offloading_spec", "primary_kv_view", "tier_type")


@dataclass(frozen=True)
class TierInfo:
    """Where a tier type comes from: ``source`` is ``"registered"`` or ``"entry point"``."""

    tier_type: str
    module_path: str
    class_name: str
    source: str


def _dist_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist else "an unknown distribution"


#: optional dependencies of built-in tiers -> the extra that installs them (pyproject.toml)
_EXTRAS = {"obstore": "s3", "valkey": "valkey", "libvalkey": "valkey"}


def _looks_like_a_path(module_path: str) -> bool:
    return "/" in module_path or "\\" in module_path or module_path.endswith(".py")


def _check_dotted(what: str, name: str, value: object) -> None:
    """``value`` is an absolute dotted name (``mypackage.mytier``; a class: ``Outer.Inner``)."""
    if not isinstance(value, str) or not value or not all(part.isidentifier() for part in value.split(".")):
        raise TierConfigError(
            f"{what}: {name} must be a dotted name of identifiers such as 'mypackage.mytier' (absolute: no "
            f"leading '.'); got {value!r}"
        )


def _import_class(module_path: str, class_name: str, what: str) -> type[SecondaryTierManager]:
    if isinstance(module_path, str) and _looks_like_a_path(module_path):
        stem = module_path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        raise TierConfigError(
            f"{what}: module_path must be a module name such as 'mypackage.mytier', not a file path; got "
            f"{module_path!r}. Make its directory importable (install the package, or put the directory on "
            f"PYTHONPATH) and write module_path={stem!r}"
        )
    # (else a bare ValueError or TypeError from importlib: "Empty module name", "the 'package'
    # argument is required")
    _check_dotted(what, "module_path", module_path)
    _check_dotted(what, "class_name", class_name)
    try:
        module = importlib.import_module(module_path)
    except ImportError as e:
        extra = _EXTRAS.get((e.name or "").split(".")[0])
        hint = f" (it comes with an extra: pip install 'asynctier[{extra}]')" if extra else ""
        raise TierConfigError(f"{what}: cannot import module {module_path!r}: {e}{hint}") from e
    except Exception as e:  # it raised as it ran (a SyntaxError, its own RuntimeError): say which tier's
        raise TierConfigError(f"{what}: importing module {module_path!r} failed: {type(e).__name__}: {e}") from e
    try:
        cls: Any = module
        for part in class_name.split("."):  # entry points may name a nested class (mod:Outer.Inner)
            cls = getattr(cls, part)
    except AttributeError:
        raise TierConfigError(f"{what}: module {module_path!r} has no attribute {class_name!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, SecondaryTierManager)):
        raise TierConfigError(
            f"{what}: {module_path}.{class_name} is not a tier: it must be a subclass of "
            "asynctier.SecondaryTierManager (for example of asynctier.BlockingChunkTier)"
        )
    return cls


def accepted_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Config keys ``cls`` accepts: its constructor's named parameters, following ``**kwargs``
    up the class hierarchy, less the ones the factory supplies."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            break
        sig = inspect.signature(init)
        var_kw = False
        for p in list(sig.parameters.values())[1:]:
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
            elif p.kind is not p.VAR_POSITIONAL and p.name not in _SUPPLIED:
                params.setdefault(p.name, p)
        if not var_kw:
            break
    return params


def accepts_any_parameter(cls: type) -> bool:
    """Whether ``cls`` takes arbitrary config keys: its ``**kwargs`` chain ends at ``object``
    (no base class left to forward them to), so the tier keeps them itself."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return True  # reached only by following **kwargs
        params = list(inspect.signature(init).parameters.values())[1:]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return False
    return True


class SecondaryTierFactory:
    """Registry of tier types; builds tiers from config dicts."""

    _registry: ClassVar[dict[str, Callable[[], type[SecondaryTierManager]]]] = {}
    _origins: ClassVar[dict[str, TierInfo]] = {}
    #: registered types whose same-named entry points were already reported as shadowed
    _shadow_warned: ClassVar[set[str]] = set()

    @classmethod
    def register_tier(cls, tier_type: str, module_path: str, class_name: str) -> None:
        """Register ``tier_type`` to be imported from ``module_path`` on first use.

        Raises ``ValueError`` if ``tier_type`` is already registered.
        """
        if not isinstance(tier_type, str) or not tier_type:
            raise TierConfigError(f"tier_type must be a non-empty str; got {tier_type!r}")
        _check_dotted(f"tier {tier_type!r}", "module_path", module_path)
        _check_dotted(f"tier {tier_type!r}", "class_name", class_name)

        def loader() -> type[SecondaryTierManager]:
            return _import_class(module_path, class_name, f"tier {tier_type!r}")

        with _REGISTRY_LOCK:  # (check and insert as one: two threads both got through)
            if tier_type in cls._registry:
                raise ValueError(f"Tier '{tier_type}' is already registered.")
            cls._registry[tier_type] = loader
            cls._origins[tier_type] = TierInfo(tier_type, module_path, class_name, "registered")

    @classmethod
    def unregister_tier(cls, tier_type: str) -> None:
        """Forget a registered tier type (for tests and plugins that replace a tier)."""
        with _REGISTRY_LOCK:
            cls._registry.pop(tier_type, None)
            cls._origins.pop(tier_type, None)
            cls._shadow_warned.discard(tier_type)

    @classmethod
    def registered(cls) -> list[TierInfo]:
        """Every known tier type: registered ones, then those offered by entry points."""
        infos = list(cls._origins.values())
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in cls._origins:
                infos.append(TierInfo(ep.name, ep.module, ep.attr, f"entry point ({_dist_name(ep)})"))
        return infos

    @classmethod
    def shadowed(cls) -> dict[str, list[str]]:
        """Entry points never used because a tier of their name is registered, by type:
        ``"module:Class (distribution)"`` each (``asynctier info`` shows them)."""
        out: dict[str, list[str]] = {}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in cls._origins:
                out.setdefault(ep.name, []).append(f"{ep.value} ({_dist_name(ep)})")
        return out

    @classmethod
    def _warn_shadowed(cls, tier_type: str) -> None:
        """Say once per type that an installed package's entry point of a registered name is
        never used (a plugin named ``fs`` was silently passed over for the built-in)."""
        if tier_type in cls._shadow_warned:
            return
        cls._shadow_warned.add(tier_type)
        origin = cls._origins.get(tier_type)
        where = f"{origin.module_path}.{origin.class_name}" if origin else "?"
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP, name=tier_type):
            log.warning(
                "entry point %r = %r of %s is not used: the tier type %r is registered (%s); "
                "rename the entry point to use it",
                ep.name, ep.value, _dist_name(ep), tier_type, where,
            )  # fmt: skip

    @classmethod
    def get_tier_class(cls, tier_config: Mapping[str, Any]) -> type[SecondaryTierManager]:
        """Resolve the tier class for a config.

        ``type`` is looked up among registered tiers, then (when ``module_path`` is given)
        imported from ``module_path`` as the class named ``type``, then among entry points
        of the group ``asynctier.tiers``.

        Raises:
            TierConfigError (a ``ValueError``): ``type`` missing, unknown, not importable,
                or not a :class:`SecondaryTierManager`.
        """
        if not isinstance(tier_config, Mapping):
            raise TierConfigError(f"tier config must be a dict; got {type(tier_config).__name__}")
        tier_type = tier_config.get("type")
        if not tier_type:
            raise TierConfigError("Secondary tier configuration must include 'type'")
        if not isinstance(tier_type, str):
            raise TierConfigError(f"'type' must be a str; got {tier_type!r}")
        module_path = tier_config.get("module_path")
        if tier_type in cls._registry:
            if module_path is not None:  # as the reference factory: the registered tier wins, but say so
                log.warning("tier type %r is registered: 'module_path' %r is ignored (rename the out-of-tree "
                            "class to use it)", tier_type, module_path)  # fmt: skip
            cls._warn_shadowed(tier_type)
            return cls._registry[tier_type]()
        if module_path is not None:
            if not isinstance(module_path, str):
                raise TierConfigError(f"'module_path' must be a str; got {module_path!r}")
            log.info("Loading out-of-tree secondary tier %r from %r.", tier_type, module_path)
            return _import_class(module_path, tier_type, f"out-of-tree tier {tier_type!r}")
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP, name=tier_type):
            if not ep.attr:
                raise TierConfigError(f"entry point {tier_type!r} = {ep.value!r} must name 'module:Class'")
            return _import_class(ep.module, ep.attr, f"tier {tier_type!r} (entry point)")
        known = sorted(i.tier_type for i in cls.registered())
        raise TierConfigError(
            f"Unknown secondary tier type: {tier_type!r}. Supported types: {known}. "
            "For an out-of-tree tier, also set 'module_path' (or install a package that "
            f"declares it in the entry-point group {ENTRY_POINT_GROUP!r})."
        )

    @classmethod
    def create_secondary_tier(
        cls,
        tier_config: Mapping[str, Any],
        primary_kv_view: memoryview,
        offloading_spec: OffloadingSpec,
    ) -> SecondaryTierManager:
        """Build (but do not open) the tier a config describes.

        The tier is constructed as ``cls(offloading_spec=..., primary_kv_view=...,
        tier_type=..., **rest_of_config)``; ``tier_config`` itself is left untouched.

        Raises:
            TierConfigError: unknown type, or a config key the tier does not accept (the
                message lists the accepted ones), or a missing required parameter.
        """
        tier_cls = cls.get_tier_class(tier_config)
        tier_type = tier_config["type"]
        kwargs = {k: v for k, v in tier_config.items() if k not in _FACTORY_KEYS}
        accepted = accepted_parameters(tier_cls)
        odd = [k for k in kwargs if not isinstance(k, str)]
        if odd:
            raise TierConfigError(f"tier {tier_type!r}: config keys must be strings; got {odd[0]!r:.80}")
        bad = sorted(k for k in kwargs if k not in accepted)
        if bad and not accepts_any_parameter(tier_cls):
            supplied = [k for k in bad if k in _SUPPLIED]
            detail = (
                f" ({', '.join(supplied)} {'is' if len(supplied) == 1 else 'are'} supplied by the factory)"
                if supplied
                else ""
            )
            raise TierConfigError(
                f"unknown parameter{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} for tier "
                f"{tier_type!r} ({tier_cls.__module__}.{tier_cls.__qualname__}){detail}; accepted: "
                f"{', '.join(sorted(accepted)) or '(none)'}"
            )
        missing = sorted(name for name, p in accepted.items() if p.default is p.empty and name not in kwargs)
        if missing:
            raise TierConfigError(
                f"tier {tier_type!r} needs parameter{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(repr, missing))} in its config"
            )
        build: Any = tier_cls  # the contract fixes the keyword arguments, not the ABC's __init__
        return build(  # type: ignore[no-any-return]
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            **kwargs,
        )
