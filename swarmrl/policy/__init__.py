"""The current policy: where each version's weights live and the one holder that swaps them in place. The on-disk
layout of committed versions (``v000007/`` + ``LATEST``) is ``swarmrl.rundir.policy_versions.PolicyDir``.

- ``sources``: where a role gets version N (``PolicySource``): a policy dir, a path template, SHARDCAST
  servers (fixed, discovered from a run dir, or announced in heartbeats).
- ``prefetch``: ``PrefetchingSource``, a source whose next version downloads in the background while the holder
  samples with one it already has (swarm nodes on slow links).
- ``holder``: ``PolicyHolder``, one model in memory whose weights are swapped to version N (the trainer and the
  validator hold their policy through it); ``BackendPolicy``, the version an inference backend serves (local
  workers and swarm nodes: a ``PolicyHolder`` under ``ours``, in-place reloads under vLLM).
"""

from swarmrl.utils.lazy import lazy_exports

_SOURCES = ("AnnouncedPolicySource", "PolicySource", "PolicyUnavailable", "RunDirPolicySource",
            "ShardcastPolicySource", "TemplatePolicySource", "make_policy_source")
__all__ = ["BackendPolicy", "PolicyHolder", "PrefetchingSource", *_SOURCES]

# lazy: sources pull in aiohttp and the holder torch
__getattr__ = lazy_exports({"PolicyHolder": "swarmrl.policy.holder",
                            "BackendPolicy": "swarmrl.policy.holder", "PrefetchingSource": "swarmrl.policy.prefetch",
                            **{n: "swarmrl.policy.sources" for n in _SOURCES}})
