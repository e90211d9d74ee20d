"""Attack tools: what a hostile peer does, kept apart from the product's honest roles. For demos (``swarmrl run
--adversary KIND``), tests (``tests/attacks/``) and benchmarks (``benchmarks/attacks/``); no honest role imports
this package.

- ``config``: a cheating node's settings and the names of the kinds (``ADVERSARY_KINDS``);
- ``adversaries``: cheating nodes, each an honest ``swarm.node.SwarmNode`` with one step replaced, and the check
  that catches each;
- ``bomb``: the upload bomb, a few-kilobyte rollout file that decodes to gigabytes;
- ``slowloris``: idle half-sent HTTP connections held against a server.
"""
