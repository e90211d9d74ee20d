"""The losses, one module each: a module named after its loss defines ``LOSS``, an instance of
``swarmrl.rl.losses.base.Loss`` whose ``name`` is the module's name. ``swarmrl.rl.losses.registry`` finds them by
walking this package, so adding a loss is adding a module here (and its line in the registry test). A module here
must import no torch at module level: the config reads the registry."""
