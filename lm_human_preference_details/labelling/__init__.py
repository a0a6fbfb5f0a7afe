"""The label tool (`python -m lm_human_preference_details.label`, label.py): a person, or several, choosing the best of
four samples on a local page, one session over fixed items, its journal replayed on restart.

    page.html     the labelling page
    server.py     the page's server: its calls, and the Host/Origin checks that keep them to this page
    session.py    the label tool's session: its fixed items and the label file it writes
    journal.py    `SessionJournal`: the session's file of record, OUTPUT.session.jsonl, replayed on restart; who
                  labelled what (`Decisions`), K labels per item, which label trains
    agreement.py  labellers' agreement: pairwise shares, Fleiss' kappa, agreement with a reference (gold)
"""
