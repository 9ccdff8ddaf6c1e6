"""The seeds' claims checked against the code: article A's six stages and printed numbers, article B's symbols, weight
and activation lists, cut tables and primitives, each judged against real modules and real ranks' records.

    layer_flow        article A's six stages of the Pre-LN layer, from the modules a real forward calls
    printed           is each number a source prints the value rounded, or a slip?
    primitives        traced ops in the seeds' names; article B's primitives table
    symbols           article B's symbols evaluated for a config; shapes evaluated and described with them
    activation_probe  forward hooks recording article B's activations by name
    meta_tables       article B's weight and activation lists from a meta-device model
    axis_cuts         which dimension each mode cuts, measured, against tbl-mat-axis and the shard specs
    cut_claims        article B's cut tables as data (its words, the claims in checkable form)
    cut_judging       those tables judged cell by cell against the ranks' records

The ranks' records come from `pylib.experiments.mode_probes`; the figures are `pylib.viz.layer_flow`,
`pylib.viz.three_axes` and `pylib.viz.matrix_dims`. Import from the module:
`from pylib.seedcheck.printed import compare_printed`.
"""
