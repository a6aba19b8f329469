"""Test helpers, imported as ``from helpers.<module> import ...`` (``tests/`` is on pytest's
``pythonpath``); fixtures live in ``tests/conftest.py``. Scripts that tests run as separate
processes (``*_ranks.py``, ``strategy_script.py``) live here too."""
