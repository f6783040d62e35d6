"""The nobackfill service. Its packages form layers, each importing only those below it
(``[tool.importlinter]`` in pyproject.toml; README "Where things are"):

entry points  main, cli, api (routers), client, db_models (and the top-level ``worker``)
application   search > migration > upgrades
domain        datasets > galleries > models > auth | jobs
storage       vectors
foundation    ml (pure math and training) | core (settings, db, errors, limits)"""
