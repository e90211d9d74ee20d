"""The job: one ``RunConfig`` (``config``), a pure ``derive`` step that turns it into every role's config and
command line, one ``Supervisor`` that starts, watches and restarts the role processes, and ``launch`` that
runs ``swarmrl run`` in local and swarm mode on top of them (warm start, ``report`` at the end)."""

from swarmrl.job.config import RunConfig, SwarmSection, WarmstartSection
from swarmrl.utils.lazy import lazy_exports

__all__ = ["RunConfig", "SwarmSection", "WarmstartSection", "launch"]

__getattr__ = lazy_exports({"launch": "swarmrl.job.launch"})  # lazy: the launcher pulls in the protocol client
