"""The campaign's outputs, each reading the one fold of the stored log
(:class:`mhsafeeval.storage.CampaignLog`): the text and JSON report (:mod:`.text`), the HTML
report (:mod:`.html`), the export of every attempt (:mod:`.export`), the comparison of two
campaigns (:mod:`.compare`) and the CI gate (:mod:`.gate`).
"""
