"""Action results reach flows/ as typed models only (actions/contracts.py).

The flow validates every result on arrival (``flows/step/invoke.py: invoke_action``) and then reads
attributes; renaming a result field then fails type checks and this test, not a run three
modules away. The check is syntactic: any string-key read (``x["field"]``, ``x.get("field")``)
in flows/ whose key is a field of an action result is a raw-dict read, except the few listed
below, which read other documents that happen to share a field name.
"""

from __future__ import annotations

import ast
from pathlib import Path

from actions import contracts

ROOT = Path(__file__).resolve().parents[1]

RESULT_FIELDS = frozenset().union(
    *(m.model_fields for m in (*contracts.RESULT_MODELS.values(), contracts.SampleStat, contracts.Prepared,
                               contracts.PromptTokens)),
    {"result", "accounting"})

ALLOWED = {
    # the campaign summary JSON the CLI wrote (its own document, not an action result)
    ("flows/commands/report.py", "accuracy"), ("flows/commands/report.py", "policy_version"),
    ("flows/commands/report.py", "weights_sha256"), ("flows/commands/report.py", "data"),  # its data line
    ("flows/campaign/reporting.py", "data"), ("flows/campaign/reporting.py", "num_prompts"),  # its evaluation line
    # OpenWhisk's REST documents: an activation record's response and an action's exec
    ("flows/invokers/openwhisk/activations.py", "result"), ("flows/invokers/openwhisk/invoker.py", "result"),
    ("flows/commands/deploy.py", "kind"),
    # a rollout object read back from the store (the drafts of later epochs)
    ("flows/campaign/drafts.py", "samples"),
    # the stored token table's rows, checked field by field there into compact arrays
    ("flows/step/token_table.py", "prompt"), ("flows/step/token_table.py", "answer_len"),
    # a length-trace row of a JSONL file (validated field by field there)
    ("flows/simulate/replay.py", "prompt_id"), ("flows/simulate/replay.py", "answer_len"),
    # an Activation's own dataclass fields, dropping its result to build the accounting record
    ("flows/invokers/base.py", "result"),
    # the one-shot runner's file envelope around a result (validated by the caller, like any)
    ("flows/invokers/child.py", "result"),
    # the configuration's own JSON dump (the run's identity), not an action result
    ("flows/config.py", "model"), ("flows/config.py", "data"),
    # a resume's data section of that identity (its paths), compared with the stored copy's
    ("flows/campaign/data_copies.py", "data"),
    # export reads the model section of that identity as the run committed it
    ("flows/commands/export.py", "model"),
}


def raw_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every string-key read of an action-result field in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args
              and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if isinstance(key, str) and key in RESULT_FIELDS:
            found.append((node.lineno, key))
    return found


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted((root / "flows").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        out += [f"{rel}:{line}: [{key!r}]" for line, key in raw_reads(path.read_text())
                if (rel, key) not in ALLOWED]
    return out


def test_no_action_result_is_read_as_a_raw_dict_in_flows():
    assert violations() == [], "read the typed result's attribute instead (actions/contracts.py)"


def test_the_check_catches_an_injected_raw_read(tmp_path):
    step = (ROOT / "flows" / "step" / "flow.py").read_text()
    injected = step + '\n\ndef _peek(out):\n    return out.generate[0]["rollout_key"], out.train.get("metrics")\n'
    (tmp_path / "flows" / "step").mkdir(parents=True)
    (tmp_path / "flows" / "step" / "flow.py").write_text(injected)
    assert [v.split(": ", 1)[1] for v in violations(tmp_path)] == ["['rollout_key']", "['metrics']"]


def test_allowed_reads_still_exist():
    """An allowance whose read is gone is stale: drop it, so it cannot hide a new raw read."""
    present = {(p.relative_to(ROOT).as_posix(), key) for p in (ROOT / "flows").rglob("*.py")
               for _, key in raw_reads(p.read_text())}
    assert ALLOWED <= present, sorted(ALLOWED - present)
