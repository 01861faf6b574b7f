"""What only the notebooks need: the measuring and plotting helpers behind each notebook (``essentials``,
``bpe``, ``stages``, ``anatomy``, ``parallel``, ``quantlab``, ``speculation``), ``notebook`` (tables,
verdicts and checks) and ``exercises`` (automatic checks of the notebooks' exercises). Nothing in the
engine imports from here."""
