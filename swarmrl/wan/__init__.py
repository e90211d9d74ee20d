"""The network harness: a swarm run's roles over emulated wide-area links, on one machine.

Every role gets a network namespace of its own, joined to a core namespace by one access link (a star). A link
is shaped to its rate by tc's token bucket filter on both ends; its added round-trip delay and packet loss come
from a user-space wire (``swarmrl.wan.wire``) that forwards IP packets between two TUN devices, so TCP sees
real loss and real round trips (this kernel has no netem). Links and profiles are in ``profiles.toml``
(``swarmrl.wan.profiles``); ``swarmrl.wan.harness.Harness`` sets a run's namespaces up and tears them down;
``swarmrl.wan.netns`` holds the namespace primitives (rights check, entering a namespace, stale clean-up);
``swarmrl.wan.measure`` measures what a link really gives (round trip, throughput).

Addresses are in 169.254.0.0/16 (link-local) and exist only inside the namespaces the harness made; no
namespace has a default route, and nothing is connected to the machine's own network.
"""
