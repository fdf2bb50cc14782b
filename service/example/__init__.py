"""The offline example: synthetic `leakyfixture` releases, a local index, a repro script."""
