"""The acceptance record and check: a drafter that loads, runs and stays lossless but accepts far
less than it did fails ``mfd-hub verify --target``, with the cause named where it can be.

The useless drafters are real copies of the shipped MFD drafter (tests/acceptance_corpus.py),
checked against the real SmolLM2 target: one through the CLI, the others through the library with
one loaded target (a process per copy would pay the target and torch's import each time). The
record's plumbing (verify --record, convert, push, cards) runs on tiny models, where a target
whose LM head is zero makes every drafter's argmax the target's own (token 0): tau is then high
and known without trusting the code under test.
"""

import json
import math
import re
import shutil

import pytest
import torch
import yaml

import acceptance_corpus
from conftest import REPO, one_error_line, run_cli_many
from mfd_hub import acceptance, load_draft, save_draft
from mfd_hub.acceptance import CHECK_PROMPTS, RECORD_NAME, THRESHOLD, assess, read_record
from mfd_hub.testing import save_tiny_target, tiny_drafter, tiny_registry_drafter, tiny_target
from mfd_hub.verify import FAIL, PASS, SKIP, verify_checkpoint
from mfd_hub.zoo.shipped import ACCEPTANCE_RECORD, SHIPPED_DRAFTERS, shipped_drafter_dir, zoo_folder

# (a drafter past help stops being measured once no outcome can bring it to the mark: "about")
FAILURE = re.compile(r"^tau (?:about )?(\d+\.\d+) on 4 prompts \(chain\), recorded (\d+\.\d+) \((\d+)%\): this drafter "
                     r"accepts far less than it did(?: \(measured until the verdict was certain: \d+ rounds\))? "
                     r"\(\d+\.\d s\)$")


# ---- tiny models: the record's plumbing ---------------------------------------------------------
def predictable_target(family="llama", **sizes):
    """A real tiny target whose LM head is zero: its greedy decoding writes token 0 for ever, and
    so does every drafter's argmax through that head."""
    target = tiny_target(family, **sizes)
    with torch.no_grad():
        target.lm_head.weight.zero_()
    return target


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-acceptance")
    target = predictable_target()
    save_tiny_target(root / "target", target)
    save_draft(tiny_drafter(target, num_modes=2), root / "draft")
    return root


def test_verify_record_writes_the_record_the_check_then_compares_with(tiny_pair, tmp_path):
    folder = shutil.copytree(tiny_pair / "draft", tmp_path / "draft")
    target = str(tiny_pair / "target")
    report = verify_checkpoint(folder, target=target, record=True)
    check = report.checks[-1]
    assert report.ok and check.name == "acceptance" and check.reason.startswith("recorded tau chain 7.75,"), report.to_dict()
    record = read_record(folder)
    assert record["prompts"] == {"sha256": acceptance.prompts_fingerprint(), "count": 8}
    assert record["target"] == {"name": "target", "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 4,
                                "vocab_size": 64}
    assert record["drafter"]["weights_dtype"] == "float32" and record["drafter"]["num_modes"] == 2
    assert set(record["tau"]) == {"chain", "product", "mixture"}
    # every drafted token is accepted: 31 tokens after the first, in rounds of 7 drafted + 1 bonus
    # (the last round drafts only the 6 still wanted), on each of the 8 prompts
    assert record["per_prompt"]["chain"] == [[31, 4]] * 8
    assert math.isclose(record["tau"]["chain"], acceptance.tau_of(record["per_prompt"]["chain"]), abs_tol=1e-4)

    again = verify_checkpoint(folder, target=target)
    assert again.ok and again.checks[-1].status == PASS and "(100%)" in again.checks[-1].reason
    kept = verify_checkpoint(folder, target=target, record=True).checks[-1]
    assert kept.status == PASS and "kept the existing acceptance.json" in kept.reason
    assert read_record(folder) == record
    assert verify_checkpoint(folder).checks[-1].status == SKIP  # no target, nothing to measure against


def test_a_useless_drafter_is_not_recorded(tmp_path):
    """A random drafter on a random target accepts almost nothing: below the floor, no record."""
    target = tiny_target("qwen3", vocab_size=512)
    save_tiny_target(tmp_path / "target", target, with_tokenizer=False)
    save_draft(tiny_drafter(target), tmp_path / "draft")
    report = verify_checkpoint(tmp_path / "draft", target=str(tmp_path / "target"), record=True)
    check = report.checks[-1]
    assert [c.name for c in report.failures()] == ["acceptance"], report.to_dict()
    assert "below the floor of 1.1: not recorded" in check.reason
    assert not (tmp_path / "draft" / RECORD_NAME).exists()


def _claim_more(folder, factor=2):
    """Rewrite a record as if the drafter had once accepted ``factor`` times as many tokens a round."""
    record = json.loads((folder / RECORD_NAME).read_text())
    record["per_prompt"]["chain"] = [[t * factor, r] for t, r in record["per_prompt"]["chain"]]
    (folder / RECORD_NAME).write_text(json.dumps(record))


def test_cli_fails_below_the_record_and_reports_a_conversion(tiny_pair, tmp_path):
    draft = shutil.copytree(tiny_pair / "draft", tmp_path / "draft")
    target = str(tiny_pair / "target")
    assert verify_checkpoint(draft, target=target, record=True).ok
    claimed = shutil.copytree(draft, tmp_path / "claimed")
    _claim_more(claimed)
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"response_ids": [0, 3, 5, 7, i]}) + "\n" for i in range(9)))
    (tmp_path / "bad.json").write_text("{not json")
    broken = shutil.copytree(draft, tmp_path / "broken")
    shutil.copyfile(tmp_path / "bad.json", broken / RECORD_NAME)
    convert = ["convert", "draft-vocab", "--corpus", tmp_path / "corpus.jsonl", "--size", "8", "--target", target]
    cases = [
        ["verify", claimed, "--target", target],
        ["verify", broken, "--target", target, "--json"],
        [*convert, draft, tmp_path / "dv"],
        [*convert, claimed, tmp_path / "dv-claimed"],
        ["verify", draft, "--record"],
    ]
    failed, broken_run, converted, converted_claimed, no_target = run_cli_many(cases, tmp_path)

    assert one_error_line(failed), failed.stderr
    assert re.search(r"failed 1 check\(s\): acceptance \(tau about 7\.\d\d on 4 prompts", failed.stderr.splitlines()[-1])
    line = next(x for x in failed.stdout.splitlines() if x.split()[:2] == ["FAIL", "acceptance"])
    assert FAILURE.match(line.split("acceptance", 1)[1].strip()), line
    assert "recorded 15.50 (50%)" in line

    report = json.loads(broken_run.stdout)
    assert broken_run.returncode == 1 and report["checks"][-1] == {
        "name": "acceptance", "status": FAIL, "reason": "acceptance.json is not JSON (JSONDecodeError)"}

    assert converted.returncode == 0, converted.stderr
    assert "acceptance: tau 7.75 on 8 prompts (chain), the source recorded 7.75 (100%); recorded in acceptance.json" \
        in converted.stderr
    assert read_record(tmp_path / "dv")["tau"]["chain"] == read_record(draft)["tau"]["chain"]
    assert converted_claimed.returncode == 0, converted_claimed.stderr
    assert "(50%): the converted drafter accepts far less than its source (no acceptance.json written)" \
        in converted_claimed.stderr
    assert not (tmp_path / "dv-claimed" / RECORD_NAME).exists()

    assert no_target.returncode == 2 and "--record measures acceptance against a target" in no_target.stderr


def test_push_refuses_a_useless_drafter_unless_told_and_then_the_card_says_so(tmp_path, monkeypatch):
    """A random drafter (below the floor) of a registry drafter's identity, with a random target
    of that identity. The refusal's verdict is kept, so the push that overrides it reuses it."""
    from mfd_hub.cards.push import plan_push
    from mfd_hub.cards.registry import load_registry
    from mfd_hub.errors import MfdHubError

    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path / "cache"))
    drafter = load_registry().get("MFD-Qwen3-8B")
    model = tiny_registry_drafter(drafter)
    folder = save_draft(model, tmp_path / "draft")
    target = tiny_target("qwen3", vocab_size=model.config.vocab_size, num_layers=model.config.num_target_layers)
    save_tiny_target(tmp_path / "target", target, with_tokenizer=False)
    common = dict(path=str(folder), dry_run=True, offline=True, progress=False, target=str(tmp_path / "target"))
    with pytest.raises(MfdHubError, match=r"fails the acceptance check, not pushing: tau (about )?1\.0\d on 4 prompts .* "
                                          r"\(--ignore-acceptance publishes it anyway, and the card says so\)"):
        plan_push(drafter.name, **common)
    plan, entries, _ = plan_push(drafter.name, ignore_acceptance=True, **common)
    card = dict(entries)["README.md"].decode()
    assert re.match(r"tau (about )?1\.0\d on 4 prompts", plan.acceptance_override) and plan.verification == "reused"
    assert f"**Published with `--ignore-acceptance`.** The acceptance check failed when this checkpoint was pushed: " \
           f"{plan.acceptance_override}" in card
    assert "Results (from the paper)" in card  # the registry's figures stay


def test_cards_carry_the_record_in_the_model_index_and_a_table(tmp_path):
    from mfd_hub.cards.model_card import render_card
    from mfd_hub.cards.registry import load_registry

    def index_taus(card):
        meta = yaml.safe_load(card.split("---")[1])
        return {m["config"]: m["value"] for r in meta["model-index"][0]["results"] for m in r["metrics"]
                if r["dataset"]["type"] == "mfd-hub-acceptance-prompts"}

    shipped = (zoo_folder("MFD-SmolLM2-135M") / "README.md").read_text()
    record = read_record(zoo_folder("MFD-SmolLM2-135M"))
    assert index_taus(shipped) == record["tau"] and set(record["tau"]) == {"chain", "product", "mixture"}
    assert f"| mixture | {record['tau']['mixture']:.2f} |" in shipped

    registry = load_registry()
    drafter = registry.get("MFD-Qwen3-8B")
    save_draft(tiny_registry_drafter(drafter), tmp_path / "draft")
    plain = render_card(drafter, path=tmp_path / "draft", registry=registry)
    shutil.copyfile(zoo_folder("MFD-SmolLM2-135M") / ACCEPTANCE_RECORD, tmp_path / "draft" / RECORD_NAME)
    carried = render_card(drafter, path=tmp_path / "draft", registry=registry)
    assert index_taus(plain) == {} and index_taus(carried) == record["tau"]
    assert "## Acceptance measured by mfd-hub" in carried and "## Acceptance measured by mfd-hub" not in plain
    # the paper's figures are the registry card's, with or without a record
    paper = [line for line in plain.splitlines() if "x (" in line]
    assert paper and all(line in carried for line in paper)


def test_shipped_records_describe_the_shipped_weights():
    assert ACCEPTANCE_RECORD == RECORD_NAME
    for name in SHIPPED_DRAFTERS:
        folder = zoo_folder(name)
        record = read_record(folder)
        draft = load_draft(folder)
        assert record["drafter"]["weights_sha256"] == acceptance.weights_fingerprint(draft), name
        assert record["drafter"]["target_layer_ids"] == draft.config.target_layer_ids
        assert acceptance.comparable(record) is None
        assert record["target"]["name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert set(record["tau"]) == set(acceptance.methods_of(draft))
        assert (shipped_drafter_dir(name) / RECORD_NAME).read_bytes() == (folder / RECORD_NAME).read_bytes()


def test_the_threshold_follows_from_the_measured_spread():
    """data/smollm2/acceptance-spread.json (benchmarks/acceptance_spread.py): float32 is the same
    in every run and at every thread count, and THRESHOLD is 1 - 3 x the largest move, rounded down."""
    from conftest import load_script

    spread = json.loads((REPO / "data" / "smollm2" / "acceptance-spread.json").read_text())
    assert spread["prompts"]["sha256"] == acceptance.prompts_fingerprint()
    exact = [r for r in spread["rows"] if r["setting"] == "float32"]
    assert len(exact) >= 2 and len({r["threads"] for r in exact}) >= 2
    assert all(r["per_prompt"] == exact[0]["per_prompt"] for r in exact)
    moves = [m for r in spread["rows"] for m in r["relative_move"].values()]
    assert spread["spread"] == max(moves) > 0
    assert load_script("benchmarks/acceptance_spread.py").derive_threshold(spread["spread"]) == THRESHOLD


# ---- the real target: drafters that are sound but useless ---------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    from mfd_hub.targets import load_target

    return load_target("smollm2")


@pytest.fixture(scope="module")
def useless(tmp_path_factory):
    return acceptance_corpus.build(tmp_path_factory.mktemp("useless"))


CAUSES = {
    "noise": "weights: not the recorded ones (their fingerprint differs)",
    "taps-reversed": "tap layers: [1, 7, 14, 20, 27] (the recorded order) restore tau",
    "mask-198": "mask token: 198 ('\\n'), not the recorded 16 ('<empty_output>')",
    "3-bit": "rounded to about 3 bits",
    "fc-zeroed": "weights: fc.weight all zeros (the context projection: the drafter no longer sees the target)",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(acceptance_corpus.USELESS) - {"noise"}))  # noise: through the CLI below
def test_a_useless_copy_fails_the_check_with_its_cause(smollm2, useless, name):
    target, tokenizer = smollm2
    result = assess(load_draft(useless[name]), target, tokenizer, useless[name], "smollm2")
    found = FAILURE.match(result.reason)
    assert not result.ok and found, result.reason
    assert float(found.group(1)) < THRESHOLD * float(found.group(2))
    assert any(CAUSES[name] in cause for cause in result.causes), result.causes


@pytest.mark.slow
def test_an_fp16_round_trip_of_the_shipped_drafter_passes(smollm2, tmp_path):
    """(The shipped drafters pass: MFD through the CLI below; all three when their verify reports
    were made, tests/test_miniature.py.)"""
    target, tokenizer = smollm2
    source = zoo_folder("MFD-SmolLM2-135M")
    folder = save_draft(load_draft(source), tmp_path / "fp16", dtype=torch.float16,
                        extra_files={RECORD_NAME: (source / RECORD_NAME).read_text()})
    result = assess(load_draft(folder), target, tokenizer, folder, "smollm2")
    assert result.ok and result.tau >= THRESHOLD * result.recorded, result.reason
    assert f"on {CHECK_PROMPTS} prompts (chain), recorded" in result.reason


@pytest.mark.slow
def test_cli_verify_fails_a_useless_drafter_and_passes_the_shipped_one(useless, tmp_path):
    noisy, shipped = run_cli_many([["verify", useless["noise"], "--target", "smollm2"],
                                   ["verify", "MFD-SmolLM2-135M", "--target", "smollm2"]], tmp_path)
    assert one_error_line(noisy), noisy.stderr
    assert f"{useless['noise']} failed 1 check(s): acceptance (tau " in noisy.stderr.splitlines()[-1]
    lines = noisy.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.split()[:2] == ["FAIL", "acceptance"])
    assert FAILURE.match(lines[at].split("acceptance", 1)[1].strip()), lines[at]
    assert lines[at + 1].split()[:1] == ["cause:"] and CAUSES["noise"] in lines[at + 1]
    assert [x.split()[1] for x in lines if x.split()[:1] == ["FAIL"]] == ["acceptance"]  # every other check passed

    assert shipped.returncode == 0, shipped.stderr
    passed = next(x for x in shipped.stdout.splitlines() if x.split()[:2] == ["pass", "acceptance"])
    assert re.search(r"tau \d\.\d\d on 4 prompts \(chain\), recorded \d\.\d\d \(\d+%\); \d+\.\d s$", passed), passed
