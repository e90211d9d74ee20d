"""A task brought by an installed package (entry-point group ``swarmrl.envs``), for the tests: calc's tasks with a
tool that a random tiny model does call (any digit ends a model turn; the reply names the turn; a turn ending in
9 ends the episode). The tests install it by putting this folder and a dist-info naming it on PYTHONPATH."""

from swarmrl.envs.calc import CalcEnv


class EchoTool(CalcEnv):
    name = "echo_tool"
    stop = tuple("0123456789")

    def respond(self, task, turns):  # noqa: ANN001, ANN201
        return None if turns[-1].endswith("9") else f"<r{len(turns)}>"


def make(max_turns: int = 4, **params) -> EchoTool:  # noqa: ANN003
    env = EchoTool(max_turns=max_turns, **params)
    env.name = "echo_tool"
    return env


def broken(**params):  # noqa: ANN003, ANN201
    return "not an environment"
