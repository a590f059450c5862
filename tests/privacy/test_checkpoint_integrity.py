"""State that cannot be edited into a smaller ε (issue 29): resume round trips for every constructor form, edited
histories and forged fresh starts refused on load, live objects that never move backwards, read-only counters,
checkpoint files that run no code, and the releases a crash leaves in flight counted."""
import copy
import os

import pytest
import torch

from fastdpot.flows import CheckpointError, DPSlicedWassersteinFlow, LabelledRowsFlow
from fastdpot.flows.labelled import label_rows
from fastdpot.privacy import BudgetExceededError, PrivacyAccountant, PrivacyBudget, PrivacyLedger

N, D, K, H = 24, 4, 4, 0.5


def _gen(seed):
    return torch.Generator().manual_seed(seed)


_DATA = torch.randn(60, D, generator=_gen(1))
_LABELLED = label_rows(torch.randn(60, D - 2, generator=_gen(2)), torch.arange(60) % 2, 2)

# constructor form -> (flow class, settings, data, how it steps: "run" samples batches, "step" is one full batch)
FORMS = {
    "noise_multiplier, batch_size, points, exact": (DPSlicedWassersteinFlow, dict(noise_multiplier=1.0, batch_size=10),
                                                    _DATA, "run"),
    "target_epsilon, batch_size": (DPSlicedWassersteinFlow, dict(target_epsilon=8.0, batch_size=10), _DATA, "run"),
    "noise_multiplier, sample_rate": (DPSlicedWassersteinFlow, dict(noise_multiplier=1.0, sample_rate=0.2), _DATA,
                                      "run"),
    "noise_multiplier, full batch": (DPSlicedWassersteinFlow, dict(noise_multiplier=1.0, batch_size=10), _DATA[:10],
                                     "step"),
    "target_epsilon, full batch": (DPSlicedWassersteinFlow, dict(target_epsilon=20.0, batch_size=10), _DATA[:10],
                                   "step"),
    "sketch release": (DPSlicedWassersteinFlow, dict(noise_multiplier=1.0, batch_size=10, release="sketch",
                                                     sketch_bins=3), _DATA, "run"),
    "histogram quantiles": (DPSlicedWassersteinFlow, dict(noise_multiplier=1.0, batch_size=10, quantiles="histogram",
                                                          histogram_bins=16), _DATA, "run"),
    "label-private rows": (LabelledRowsFlow, dict(target_epsilon=8.0, batch_size=10, num_classes=2), _LABELLED,
                           "run"),
}


def _flow(form, seed=7):
    cls, kw, _, _ = FORMS[form]
    return cls(N, D, K, H, steps=6, secure_mode=False, generator=_gen(seed), **kw)


def _advance(flow, form, steps):
    _, _, data, how = FORMS[form]
    if how == "run":
        flow.run(data, steps=steps, progress=False)
    else:
        for _ in range(steps):
            flow.step(data)


@pytest.mark.parametrize("form", list(FORMS))
def test_resume_gives_the_uninterrupted_particles_and_epsilon(form, tmp_path):
    full = _flow(form)
    _advance(full, form, 6)
    half = _flow(form)
    _advance(half, form, 3)
    state = half.state_dict()
    path = str(tmp_path / "flow.pt")
    half.save(path)
    into = _flow(form, seed=99)  # another start: load_state_dict replaces everything
    into.load_state_dict(state)
    for resumed in (type(half).from_state_dict(state), type(half).load(path), into):
        assert resumed.steps_taken == 3 and resumed.epsilon() == half.epsilon()
        _advance(resumed, form, 3)
        assert resumed.steps_taken == 6
        torch.testing.assert_close(resumed.particles, full.particles, rtol=0, atol=0)
        assert resumed.epsilon() == full.epsilon() > 0


def _three_steps(**kw):
    f = DPSlicedWassersteinFlow(N, D, K, H, steps=6, batch_size=10, secure_mode=False, generator=_gen(3),
                                **(kw or dict(noise_multiplier=1.0)))
    f.run(_DATA, steps=3, progress=False)
    return f


def _history(st):
    return st["accountant"]["history"] + (st["budget"]["accountant"]["history"] if st["budget"] else [])


_EDITS = [
    ("noise multiplier of every event", lambda st: [h.update(noise_multiplier=100.0) for h in _history(st)],
     r"history'\]\[0\] is not this ledger's mechanism.*noise_multiplier"),
    ("dataset size of every event", lambda st: [h.update(dataset_size=10 ** 7, sample_rate=10 / 10 ** 7)
                                                for h in _history(st)], r"history'\]\[0\].*dataset_size"),
    ("sampling and relation of every event",
     lambda st: [a.update(neighboring_relation=None) for a in (st["accountant"],)]
     + [h.update(sampling="poisson", dataset_size=None, batch_size=None) for h in _history(st)],
     r"history'\]\[0\].*sampling"),
    ("fewer counted releases", lambda st: [h.update(num_steps=1) for h in _history(st)], "releases_lost"),
    ("an accountant of another kind", lambda st: st["accountant"].update(accountant="pld"), "accountant kind"),
    ("no releases in flight but negative lost ones", lambda st: st.update(releases_lost=-1), "releases_lost"),
    ("releases in flight past T", lambda st: st.update(releases_in_flight=10), "planned T"),
    ("a fresh start with the trained particles", lambda st: st.update(step=0, mode=None, bound_n=None,
                                                                     bound_batch=None, accountant=None, budget=None),
     "initial particles"),
]


@pytest.mark.parametrize("what,edit,match", _EDITS, ids=[e[0] for e in _EDITS])
def test_edited_states_are_refused_and_nothing_changes(what, edit, match):
    src = _three_steps()
    bad = copy.deepcopy(src.state_dict())
    edit(bad)
    with pytest.raises(ValueError, match=match):
        DPSlicedWassersteinFlow.from_state_dict(bad)
    live = _three_steps()
    before = (live.steps_taken, live.epsilon(), live.particles.clone())
    with pytest.raises(ValueError):
        live.load_state_dict(bad)
    assert (live.steps_taken, live.epsilon()) == before[:2] and torch.equal(live.particles, before[2])


def test_a_calibrated_noise_multiplier_cannot_be_edited():
    src = _three_steps(target_epsilon=8.0)
    for z in (100.0, src.noise_multiplier * 0.5):
        bad = copy.deepcopy(src.state_dict())
        bad["noise_multiplier"] = z
        for h in _history(bad):
            h["noise_multiplier"] = z
        with pytest.raises(ValueError, match="calibrated noise multiplier"):
            DPSlicedWassersteinFlow.from_state_dict(bad)
    assert DPSlicedWassersteinFlow.from_state_dict(src.state_dict()).epsilon() == src.epsilon()


def test_a_forged_data_set_size_is_caught_before_the_next_release():
    # bound_n and every event edited together is self-consistent; n is private data, so it is checked when the
    # data come back: the next run refuses before it releases anything (docs/privacy.md, threat model)
    st = copy.deepcopy(_three_steps().state_dict())
    st["bound_n"] = 10 ** 7
    for h in _history(st):
        h.update(dataset_size=10 ** 7, sample_rate=10 / 10 ** 7)
    forged = DPSlicedWassersteinFlow.from_state_dict(st)
    eps = forged.epsilon()
    with pytest.raises(ValueError, match="bound to n=10000000"):
        forged.run(_DATA, steps=1, progress=False)
    assert forged.steps_taken == 3 and forged.epsilon() == eps


def test_a_fresh_start_is_accepted_when_it_is_one():
    f = DPSlicedWassersteinFlow(N, D, K, H, steps=6, noise_multiplier=1.0, batch_size=10, init="gaussian_scaled",
                                init_scale=0.3, secure_mode=False, generator=_gen(4))
    g = DPSlicedWassersteinFlow.from_state_dict(f.state_dict())
    torch.testing.assert_close(g.particles, f.particles, rtol=0, atol=0)
    g.run(_DATA, steps=2, progress=False)
    st = f.state_dict()
    st["particles"] = st["particles"] + 1e-3  # not the draw its init record reproduces
    with pytest.raises(ValueError, match="initial particles"):
        DPSlicedWassersteinFlow.from_state_dict(st)
    lab = LabelledRowsFlow(N, D, K, H, steps=6, noise_multiplier=1.0, batch_size=10, num_classes=2,
                           class_particles=[20, 4], secure_mode=False, generator=_gen(5))
    st = lab.state_dict()
    assert st["init"]["class_particles"] == [20, 4]
    LabelledRowsFlow.from_state_dict(st)
    st["particles"] = st["particles"].flip(0)  # the same rows, other classes: not the recorded start
    with pytest.raises(ValueError, match="initial particles"):
        LabelledRowsFlow.from_state_dict(st)


def test_a_live_flow_never_moves_backwards():
    f = DPSlicedWassersteinFlow(N, D, K, H, steps=6, noise_multiplier=1.0, batch_size=10, secure_mode=False,
                                generator=_gen(6))
    f.run(_DATA, steps=4, progress=False)
    at4 = f.state_dict()
    f.run(_DATA, steps=2, progress=False)
    eps6 = f.epsilon()
    with pytest.raises(ValueError, match="never moves backwards"):
        f.load_state_dict(at4)
    assert f.steps_taken == 6 and f.epsilon() == eps6
    fresh = DPSlicedWassersteinFlow.from_state_dict(at4)  # a new object has nothing to compare with
    fresh.load_state_dict(f.state_dict())  # forward is fine
    assert fresh.steps_taken == 6 and fresh.epsilon() == eps6


def test_budget_and_accountant_never_move_backwards():
    b = PrivacyBudget(10.0, 1e-5)
    b.spend(1.0, 0.01, 300)
    old = b.state_dict()
    b.spend(1.0, 0.01, 300)
    eps = b.epsilon_spent
    with pytest.raises(ValueError, match="never moves backwards"):
        b.load_state_dict(old)
    edited = copy.deepcopy(b.state_dict())
    edited["accountant"]["history"][0]["noise_multiplier"] = 100.0
    with pytest.raises(ValueError, match="never moves backwards"):
        b.load_state_dict(edited)
    with pytest.raises(ValueError, match="never moves backwards"):
        b.load_state_dict(dict(b.state_dict(), delta_tail_spent=0.0, accountant=dict(old["accountant"], history=[])))
    assert b.epsilon_spent == eps and b.steps == 600
    a = PrivacyAccountant()
    a.step(1.0, 0.01, 10)
    later = copy.deepcopy(a)
    later.step(2.0, 0.01, 5)
    for bad in (dict(a.state_dict(), history=[]), PrivacyAccountant().state_dict()):
        with pytest.raises(ValueError, match="never moves backwards"):
            a.load_state_dict(bad)
    a.load_state_dict(later.state_dict())
    assert a.steps == 15
    led = PrivacyLedger(1e-5, 10, delta_tail=0.0, noise_multiplier=1.0)
    led.bind(sample_rate=0.1)
    led.spend(2)
    with pytest.raises(ValueError, match="never moves backwards"):
        led.load_state_dict(dict(led.state_dict(), accountant=dict(led.state_dict()["accountant"], history=[])))


@pytest.mark.parametrize("obj,attr", [
    (PrivacyBudget(1.0, 1e-5), "delta_tail_spent"), (PrivacyBudget(1.0, 1e-5), "epsilon"),
    (PrivacyBudget(1.0, 1e-5), "accountant"), (PrivacyAccountant(), "steps"), (PrivacyAccountant(), "history"),
    (PrivacyLedger(1e-5, 10, noise_multiplier=1.0), "accountant"),
    (PrivacyLedger(1e-5, 10, noise_multiplier=1.0), "budget"),
    (PrivacyLedger(1e-5, 10, noise_multiplier=1.0), "noise_multiplier"),
])
def test_counters_are_read_only(obj, attr):
    with pytest.raises(AttributeError):
        setattr(obj, attr, 0)


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):  # unpickling this writes a file: what a malicious checkpoint would run
        return (open, (self.path, "w"))


def test_loading_a_checkpoint_runs_no_code(tmp_path):
    marker = str(tmp_path / "ran")
    good = _three_steps().state_dict()
    path = str(tmp_path / "evil.pt")
    torch.save(dict(good, payload=_Payload(marker)), path)
    with pytest.raises(CheckpointError, match="evil.pt"):
        DPSlicedWassersteinFlow.load(path)
    assert not os.path.exists(marker)


def test_releases_in_flight_at_a_crash_are_counted(tmp_path):
    path = str(tmp_path / "flow.pt")
    f = DPSlicedWassersteinFlow(N, D, K, H, steps=12, noise_multiplier=1.0, batch_size=10, secure_mode=False,
                                generator=_gen(8))

    accept = f._accept

    def crash(new, drift):  # the run dies inside step 3, after its release; its last checkpoint is at step 2 (an
        accept(new, drift)  # exception in a callback would checkpoint step 3 first: test_flow.py)
        if f.steps_taken == 3:
            raise KeyboardInterrupt

    f._accept = crash
    with pytest.raises(KeyboardInterrupt):
        f.run(_DATA, progress=False, checkpoint_path=path, checkpoint_every=2)
    released = f.epsilon()  # what the dead run had released (3 steps)
    state = torch.load(path, weights_only=True)
    assert state["step"] == 2 and state["releases_in_flight"] == 2
    resumed = DPSlicedWassersteinFlow.load(path)
    assert resumed.steps_taken == 2 and resumed.ledger.steps_spent == 4 and resumed.epsilon() >= released
    resumed.run(_DATA, progress=False, checkpoint_path=path)
    assert resumed.ledger.steps_spent == 12 and resumed.steps_taken == 10
    assert DPSlicedWassersteinFlow.load(path).ledger.steps_spent == 12  # the end of a run leaves nothing in flight
    resumed.run(_DATA, steps=1, progress=False)  # the plan is used up: nothing more is released
    assert resumed.stop_reason == "planned_steps" and resumed.ledger.steps_spent == 12
    with pytest.raises(BudgetExceededError):
        resumed.ledger.spend()
