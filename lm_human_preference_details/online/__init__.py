"""The paper's online collection (section 2.2): while PPO trains, requests sampled from the current policy go to a
labeller, their answers become the run's label file, and the reward model trains again as the schedule says.

    collection.py  `OnlineCollection`: the requests, PPO's waits for labels, the trainings, through a run and a resume
    schedule.py    the schedule l(n) and its flags (`OnlineHParams`, `Schedule`)
    answers.py     a request (`Request`) and `AnswerRecord`, the durable record of every answer (RUN/online/answers.jsonl)
    label_file.py  `OnlineLabelFile`, the run's labels (RUN/online/labels.json): appended, checked on resume
    labellers.py   who answers: the gold scorer, a command (the `ID BEST` protocol); `make_labeller` picks one
    page.py        the page labeller: the labelling page served from the run, over its requests as they come
"""
