"""Bad input, fuzzed: every input kind the scripts read, mutated with seeded edits (benchmarks/fuzzing.py), ends
in a run, a logged skip with a count, or one InputError line. Never another exception, never a hang.

benchmarks/fuzz_inputs.py runs thousands of the same cases and reports the counts."""

from collections import Counter

import pytest

from fuzzing import KINDS, Resources, quiet_libraries, run_cases

CASES_PER_KIND = 20  # 18 kinds: 360 cases


@pytest.fixture(scope="module")
def resources(tiny_checkpoint, tmp_path_factory):
    with quiet_libraries():
        resources = Resources(tiny_checkpoint, tmp_path_factory.mktemp("fuzz"))
        yield resources
        resources.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_mutated_input_ends_in_a_run_a_skip_or_one_error_line(kind, resources):
    counts, failures = run_cases(resources, [kind], range(CASES_PER_KIND))
    report = "\n\n".join(f"{case.kind} seed {case.seed}: {case.outcome}\n{case.detail}" for case in failures[:3])
    assert not failures, f"{len(failures)} of {CASES_PER_KIND} cases failed; first ones:\n{report}"
    assert sum(counts.values()) == CASES_PER_KIND


def test_mutations_are_not_all_harmless(resources):
    # The fuzzing must reach the checks: across kinds, both refusals and runs occur.
    counts, _ = run_cases(resources, ["glue_tsv", "squad_train", "config_json"], range(8))
    outcomes = Counter(outcome for (_, outcome), n in counts.items() for _ in range(n))
    assert outcomes["refusal"] >= 4 and outcomes["run"] + outcomes["skip"] >= 2, outcomes
