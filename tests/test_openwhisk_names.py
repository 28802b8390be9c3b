"""A namespaced ``invoker.package`` (``/NS/PKG``) reaches the actions end to end, against the
controller emulator; a package path the client cannot resolve is refused at config load."""

from __future__ import annotations

import pytest

from flows.config import load_config
from flows.invokers.openwhisk import OpenWhiskInvoker

try:
    from ow_emulator import OpenWhiskEmulator, ow_emulator  # noqa: F401
    from test_openwhisk import make_client, put_action
except ImportError:  # tests/ imported as a package
    from tests.ow_emulator import OpenWhiskEmulator, ow_emulator  # noqa: F401
    from tests.test_openwhisk import make_client, put_action


@pytest.mark.parametrize("package", ["/guest/rlhfless", "/guest/rlhfless/", "rlhfless"])
def test_a_namespaced_package_invokes_the_action(ow_emulator: OpenWhiskEmulator, package: str):
    with make_client(ow_emulator) as client:
        put_action(client, "noop")
        invoker = OpenWhiskInvoker(client, package=package, timeout_s=30.0)
        assert invoker.invoke("noop", {}).result == {"ok": True}
        assert invoker.prewarm("noop", 1) in (0, 1)


def test_the_preflight_accepts_a_namespaced_package(ow_emulator: OpenWhiskEmulator, monkeypatch):
    from flows.invokers.factory import check_invoker

    for key, value in ow_emulator.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RLHFLESS_OPENWHISK_SECRET", raising=False)
    with make_client(ow_emulator) as client:
        put_action(client, "evaluate")
        put_action(client, "generate")
    check_invoker(load_config(None, ["invoker.kind=openwhisk", "invoker.package=/guest/rlhfless"]))


@pytest.mark.parametrize("value, hint", [
    ("guest/rlhfless", "; did you mean '/guest/rlhfless'?"),
    ("/guest/rlhfless/", "; did you mean '/guest/rlhfless'?"),
    ("rlhfless/", "; did you mean 'rlhfless'?"),
    ("/a/b/c", ""),
    ("/", ""),
])
def test_a_package_path_the_client_cannot_resolve_is_refused_at_load(value: str, hint: str):
    with pytest.raises(ValueError) as info:
        load_config(None, [f"invoker.package={value}"])
    assert str(info.value) == (f"invoker.package '{value}' is not an OpenWhisk package path: write PKG, "
                               f"/NAMESPACE/PKG or /NAMESPACE (a namespace after a leading '/', no trailing '/'){hint}")


@pytest.mark.parametrize("value", ["rlhfless", "/guest/rlhfless", "/guest", ""])
def test_the_package_paths_the_client_resolves_load(value: str):
    assert load_config(None, [f"invoker.package={value}"]).invoker.package == value
