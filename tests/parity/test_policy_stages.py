"""A policy's stage names are the model's: a misspelled stage, in the file or in a caller, is
refused naming it instead of silently taking the mode's default gate."""

import json
import re
import sys
from pathlib import Path

import pytest

from ncnnport.parity.policy import Policy
from ncnnport.registry import KNOWN_MODELS, get_port


# A stage name a model folder's code asks the policy for, as a literal: ``.stage("x"``,
# ``tol_for("x"``, ``_stage_tol(ctx, "x"``, or a bench case's ``logits_stage="x"``.
ASKED = re.compile(r'(?:\.stage|tol_for|_stage_tol\([^,()]+,)\(?\s*"([a-z_]+)"|logits_stage="([a-z_]+)"')


@pytest.mark.parametrize("model", sorted(KNOWN_MODELS))
def test_every_port_declares_the_stages_its_code_asks_for_and_its_policy_states_only_those(model):
    """Read from the model folder's sources: a name the code asks for but the port does not
    declare would be refused at run time, on a path (streamed parity at real scale, say) the
    tests may not run; a declared name nothing asks for is a stale entry."""
    port = get_port(model)
    assert port.policy_stages, f"{model}: declare policy_stages"
    Policy.load(port.policy_path, stages=port.policy_stages)   # the file states only declared stages
    folder = Path(sys.modules[type(port).__module__].__file__).parent
    asked = {a or b for f in folder.glob("*.py") for a, b in ASKED.findall(f.read_text())}
    assert asked, f"{model}: no stage found in {folder}: the pattern no longer matches the code"
    assert asked <= set(port.policy_stages), f"{model}: asked but not declared: {sorted(asked - set(port.policy_stages))}"
    assert set(port.policy_stages) <= asked, f"{model}: declared, asked nowhere: {sorted(set(port.policy_stages) - asked)}"


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


# ---------------------------------------------------------------------------------------------
# module names: the same silent default, for a module entry or a caller's graph name


@pytest.mark.parametrize("model", sorted(KNOWN_MODELS))
def test_every_policy_names_only_graphs_of_its_models_specs(model):
    """The module entries of each model's policy (precision modes, the roundoff rule and its
    propagated part) are graphs of the tiny preset's specs, as ``prepare`` loads it."""
    from ncnnport.stages import prepare
    from ncnnport.targets import Target

    prepared = prepare(Target(model))
    assert prepared.policy.modules == {s.name for s in prepared.specs} | set(prepared.port.host_modules)


def write_modules(tmp_path, section):
    data = {"version": 1, "precisions": {"fp32": {}}}
    if section == "precisions":
        data["precisions"]["fp32"]["modules"] = {"vae_decod": {"*": {"min_cosine": 0.9}}}
    else:
        rule = {"kappa_abs": 4, "kappa_cos": 4, "propagated": {"kappa_abs": 8}}
        if section == "rule":
            rule["modules"] = {"vae_decod": {"kappa_abs": 9}}
        else:
            rule["propagated"]["modules"] = {"vae_decod": {"kappa_abs": 9}}
        data["roundoff_rule"] = rule
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("section, where", [("precisions", "precisions.fp32.modules"),
                                            ("rule", "roundoff_rule.modules"),
                                            ("propagated", "roundoff_rule.propagated.modules")])
def test_a_misspelled_module_in_the_file_is_refused_naming_where(tmp_path, section, where):
    path = write_modules(tmp_path, section)
    Policy.load(path)                                            # undeclared: taken as written
    with pytest.raises(ValueError, match=rf"policy.json: {where}.vae_decod: not a graph of this model "
                                         r"\(vae_decode, vae_encode\)"):
        Policy.load(path, modules=("vae_encode", "vae_decode"))


def test_asking_for_an_undeclared_module_is_refused_local_and_propagated(tmp_path):
    path = write_modules(tmp_path, "precisions")
    policy = Policy.load(path, modules=("vae_decod", "vae_encode"))
    assert policy.module("vae_decod")["*"].min_cosine == 0.9
    for ask in (policy.module, policy.propagated_module):
        with pytest.raises(ValueError, match=r"no module 'vae_decode' in this model's graphs \(vae_decod, vae_encode\)"):
            ask("vae_decode", "fp16")
    assert Policy.load(path).module("other") == {"*": Policy.load(path).default()}   # undeclared: the default


def test_youtu_vls_host_module_is_its_tied_embedding_lookup():
    """The traced host module is declared under the name the lookup runs as."""
    from ncnnport.models.youtu_vl.tied_embed import EMBED_NAME

    assert get_port("youtu-vl").host_modules == (EMBED_NAME,)
