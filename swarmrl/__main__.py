import os

if "SWARMRL_PARENT_PID" in os.environ:  # a role started by ``swarmrl run``: it dies with the launcher
    from swarmrl.utils.procs import adopt_parent_death

    adopt_parent_death()

from swarmrl.cli import main  # noqa: E402

main()
