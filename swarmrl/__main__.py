import os

if "SWARMRL_PARENT_PID" in os.environ:  # a role started by ``swarmrl run``: it dies with the launcher
    from swarmrl.utils.procs import adopt_parent_death

    adopt_parent_death()

if "SWARMRL_NETNS" in os.environ:  # a role under a network profile (swarmrl.wan): into its namespace, first
    from swarmrl.wan.netns import enter_from_env

    enter_from_env()

from swarmrl.cli import main  # noqa: E402

main()
