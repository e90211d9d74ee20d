"""Link profiles (``profiles.toml`` beside this module): named links (rate, added round trip, loss) and named
profiles saying which link each role of a swarm run gets."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

from pydantic import Field, model_validator

from swarmrl.config import StrictModel

PROFILES_FILE = Path(__file__).with_name("profiles.toml")

# roles that sit on the profile's ``servers`` link (the adapter shares the trainer's namespace)
SERVER_ROLES = ("orchestrator", "trainer", "validator")


class Link(StrictModel):
    """One access link, the same both ways: ``rate_mbit`` (0: unshaped), ``rtt_ms`` added to every round trip
    through it (half each way), ``loss`` the chance each packet is dropped, in each direction."""

    rate_mbit: float = Field(0.0, ge=0)
    rtt_ms: float = Field(0.0, ge=0, le=10_000)
    loss: float = Field(0.0, ge=0, lt=1)
    mtu: int = Field(1500, ge=576, le=65535)

    @property
    def wired(self) -> bool:
        """Whether the link needs the user-space wire (delay or loss), or is a plain veth pair."""
        return self.rtt_ms > 0 or self.loss > 0

    def burst_bytes(self) -> int:
        """The token bucket's depth: 4 ms at the rate, at least 16 full packets (tbf needs more than one MTU)."""
        return max(16 * self.mtu, int(self.rate_mbit * 1e6 / 8 * 0.004))

    def describe(self) -> str:
        rate = f"{self.rate_mbit:g} Mbit/s" if self.rate_mbit else "unshaped"
        return f"{rate}, +{self.rtt_ms:g} ms RTT, {100 * self.loss:g}% loss"


class Profile(StrictModel):
    description: str = ""
    servers: str = "dc"
    relays: str = "dc"
    nodes: list[str] = Field(default_factory=lambda: ["dc"], min_length=1)
    roles: dict[str, str] = Field(default_factory=dict)  # role name -> link name, overriding the above


class ProfileFile(StrictModel):
    links: dict[str, Link]
    profiles: dict[str, Profile]

    @model_validator(mode="after")
    def _known_links(self) -> ProfileFile:
        for name, p in self.profiles.items():
            bad = sorted({p.servers, p.relays, *p.nodes, *p.roles.values()} - set(self.links))
            if bad:
                raise ValueError(f"profile {name!r} names unknown links {bad}; links: {', '.join(self.links)}")
        return self


@cache
def load_profiles(path: str | None = None) -> ProfileFile:
    return ProfileFile.model_validate(tomllib.loads(Path(path or PROFILES_FILE).read_text()))


def link_plan(profile: str, roles: list[str], overrides: dict[str, str] | None = None,
              profiles: ProfileFile | None = None) -> dict[str, Link]:
    """Each role's link under ``profile``: servers, relays (``relay*``) and nodes (the rest, in the given order,
    cycling through the profile's node links); ``overrides`` (role -> link name) win over the profile's
    ``roles``, which win over the rest."""
    pf = profiles or load_profiles()
    if profile not in pf.profiles:
        raise ValueError(f"unknown network profile {profile!r}; choose from {', '.join(pf.profiles)}")
    p = pf.profiles[profile]
    named = {**p.roles, **(overrides or {})}
    bad = sorted(set(named.values()) - set(pf.links))
    if bad:
        raise ValueError(f"unknown links {bad}; links: {', '.join(pf.links)}")
    out, i = {}, 0
    for role in roles:
        if role in SERVER_ROLES:
            name = p.servers
        elif role.startswith("relay"):
            name = p.relays
        else:
            name, i = p.nodes[i % len(p.nodes)], i + 1
        out[role] = pf.links[named.get(role, name)]
    return out
