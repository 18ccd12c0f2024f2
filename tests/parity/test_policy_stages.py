"""A policy's stage names are the model's: a misspelled stage, in the file or in a caller, is
refused naming it instead of silently taking the mode's default gate."""

import json

import pytest

from ncnnport.parity.policy import Policy
from ncnnport.registry import KNOWN_MODELS, get_port


@pytest.mark.parametrize("model", sorted(KNOWN_MODELS))
def test_every_port_declares_its_stages_and_its_policy_states_only_those(model):
    port = get_port(model)
    assert port.policy_stages, f"{model}: declare policy_stages"
    policy = Policy.load(port.policy_path, stages=port.policy_stages)
    for stage in port.policy_stages:
        assert policy.stage(stage, "fp32") is not None


def write(tmp_path, stages_fp32=None, rule_stages=None):
    data = {"version": 1, "precisions": {"fp32": {"stages": stages_fp32 or {}}}}
    if rule_stages is not None:
        data["roundoff_rule"] = {"kappa_abs": 4, "kappa_cos": 4, "stages": rule_stages}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    return path


def test_a_misspelled_stage_in_the_file_is_refused_naming_the_file_mode_and_stage(tmp_path):
    path = write(tmp_path, {"last_logit": {"min_cosine": 0.99}})
    assert Policy.load(path).stage("last_logit").min_cosine == 0.99     # undeclared: taken as written
    with pytest.raises(ValueError, match=r"policy.json: precisions.fp32.stages.last_logit: not a stage of this "
                                         r"model's pipeline \(last_logits, vision\)"):
        Policy.load(path, stages=("vision", "last_logits"))
    path = write(tmp_path, rule_stages={"visoin": {"kappa_abs": 9}})
    with pytest.raises(ValueError, match=r"roundoff_rule.stages.visoin: not a stage"):
        Policy.load(path, stages=("vision",))


def test_asking_for_an_undeclared_stage_is_refused_not_given_the_default(tmp_path):
    path = write(tmp_path, {"last_logits": {"min_cosine": 0.99}})
    policy = Policy.load(path, stages=("last_logits",))
    assert policy.stage("last_logits").min_cosine == 0.99
    with pytest.raises(ValueError, match=r"no stage 'logits' in this model's pipeline \(last_logits\)"):
        policy.stage("logits", "fp16")
    assert Policy.load(path).stage("logits") == Policy.load(path).default()   # undeclared: the default
