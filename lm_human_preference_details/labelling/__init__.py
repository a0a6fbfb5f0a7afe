"""Labelling: people on a local page, or programs, choosing the best of four samples; the label tool's sessions and
the paper's online collection while a policy trains.

    page.html     the labelling page
    server.py     the page's server: its calls, and the Host/Origin checks that keep them to this page
    session.py    the label tool's session: its fixed items and the label file it writes
    journal.py    `SessionJournal`: the label tool's file of record, OUTPUT.session.jsonl, replayed on restart; who
                  labelled what (`Decisions`), K labels per item, which label trains
    agreement.py  labellers' agreement: pairwise shares, Fleiss' kappa, agreement with a reference (gold)
    labellers.py  who labels the online requests: the gold scorer, a command, the page
    online.py     the paper's online collection (section 2.2): requests from the training policy, waits, trainings
    schedule.py   the online schedule l(n) and its flags (`OnlineHParams`, `Schedule`)
    online_labels.py  `OnlineLabelFile`, the online run's labels (RUN/online/labels.json), appended, checked on resume
    answers.py    the online requests and `AnswerRecord`, the durable record of every answer (answers.jsonl)
"""
