"""No-op action: used to pre-warm containers and to probe the invoker."""


def main(args: dict) -> dict:
    return {"ok": True}
