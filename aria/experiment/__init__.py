"""Does aggregation help? The iterated experiment and its analyses, above the pipeline and the trainers.

=============  ==================================================================================
``runner``     the experiment: check the settings, plan the stages (collect, label, train, merge,
               evaluate, movement), run them resumably under one run folder (``scripts/run_experiment.py``)
``settings``   the experiment's settings (config/experiment.yaml), checked once and read as attributes
``layout``     where each stage writes in the run folder, an arm's settings, a copy without weights
``report``     ``table.md`` and ``results.json`` of a run: the arms, their paired tests, the verdicts
``tables``     README and docs tables rendered from the committed results (``scripts/render_docs.py``)
``movement``   did training move a policy? A trained model against its parent on held-out steps
``grouping``   the grouping schemes (ARIA, its windows, GiGPO, the ablation) side by side on one labelled run
=============  ==================================================================================

Each module is imported by its own path (``from aria.experiment.runner import run``): this file
imports nothing, so importing one part does not load the others.
"""
