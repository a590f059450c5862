"""A run killed inside a step, for the flows' checkpoint tests (tests/flows/test_flow.py, test_flow_release.py)."""


class Kill(Exception):
    """The 'process' died."""


def crash_in_step(flow, step):
    """The run dies inside step ``step`` after its release (as a killed process would, before any checkpoint of
    it): the step's exception is not a callback's, so no checkpoint is written for it."""
    accept = flow._accept

    def crashing(new, drift):
        accept(new, drift)
        if flow.steps_taken == step:
            raise Kill()

    flow._accept = crashing
