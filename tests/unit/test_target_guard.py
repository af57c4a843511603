"""The target guard's judgement (plugins/filter/target_guard.py): a run that would act on no host is refused
with why and what to do; one that targets a host passes."""
from ansible_collections.dflash.trainer.plugins.filter.target_guard import FilterModule, trainer_target_problem


def test_a_pattern_that_matches_a_host_passes():
    assert trainer_target_problem("trainer_hosts", "trainer_hosts", ["lab-200"], None, ["inv.yml"]) == ""


def test_no_host_within_the_limit_names_pattern_limit_and_inventory():
    msg = trainer_target_problem("trainer_hosts", "trainer_hosts", [], "lab-201", ["a.yml", "b.yml"])
    assert msg.startswith("no host matched the pattern 'trainer_hosts' within --limit 'lab-201' in the inventory "
                          "a.yml, b.yml: ")
    assert "nothing was deployed, restarted or read" in msg


def test_no_host_without_a_limit_says_no_limit():
    msg = trainer_target_problem("trainer_hostz", "trainer_hostz", [], None, ["inv.yml"])
    assert msg.startswith("no host matched the pattern 'trainer_hostz' in the inventory inv.yml: ") and "--limit" not in msg


def test_a_pattern_set_where_plays_cannot_see_it_is_refused_first():
    """Even when hosts matched: the play would act on another pattern than the one the task sees."""
    msg = trainer_target_problem("gpu", "trainer_hosts", ["lab-200"], None, [])
    assert "trainer_target_hosts is 'gpu' in the inventory" in msg and "would act on 'trainer_hosts'" in msg
    assert "-e trainer_target_hosts=gpu" in msg


def test_the_filter_is_registered_by_its_name():
    assert FilterModule().filters()["trainer_target_problem"] is trainer_target_problem


def test_the_guard_play_runs_on_the_targets_first_then_every_host_then_localhost_each_once():
    from ansible_collections.dflash.trainer.plugins.filter.target_guard import trainer_guard_hosts
    assert trainer_guard_hosts(["b", "a"], ["a", "b", "c"]) == ["b", "a", "c", "localhost"]
    assert trainer_guard_hosts([], ["a"]) == ["a", "localhost"]
    assert trainer_guard_hosts(["localhost"], []) == ["localhost"]
