"""The generate stage: settings, the stage chain, state file and ledger, the Dask driver."""
