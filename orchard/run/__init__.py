"""The run: one lifecycle that the CLI, ``--multirun``, ``resume`` and sweeps all take.

``lifecycle`` is the path (prepare, preflight, Ray session, run_one); ``preflight`` what is
refused before anything starts; ``services`` what runs beside a run; ``ending`` the close that
always happens and the summary after it; ``resume``, ``from_the_store`` and ``multirun`` the
other ways in; ``divergence`` the check every training loop calls.
"""
