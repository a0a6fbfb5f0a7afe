"""Query data (FIDELITY A1-A5, E9 per-rank seeds): from a `--task.query-dataset` value to batches of queries, one
module per job.

Down the floors, each entered once: the value becomes a `QuerySource` once, when the flags are checked
(`registry.query_source`, the one place that decides what a name or path is, called by `tasks.TaskHParams.source`
alone; the source's checks run before anything heavy), `samplers.make_query_sampler` asks the task's source for its
batches, each rank draws from its stream (`streams`), and `batches` processes and batches the queries.

    source.py     what a source is and is asked: `QuerySource`, `Request`
    registry.py   the names and file types --task.query-dataset takes; `query_source`, `check_query_dataset`
    hub.py        the Hub's parquet export (bookcorpus) and local parquet files
    tldr17.py     webis/tldr-17's corpus archive, read as its loading script read it
    oai2019.py    OpenAI's 2019 sources: books-2019, tldr-2019, cnndm, the queries of label files
    text_files.py local .jsonl/.txt query files
    columns.py    a memory-mapped text column and its row-count checks
    streams.py    per-rank streams: seeded shuffles, the shard rule, a rank's window of rows
    batches.py    A4 query processing, A5 query formatting, the sampler interface and its checks
    samplers.py   the two kinds of source, `ColumnSource` and `TextSource`, with their samplers; `make_query_sampler`
"""

from lm_human_preference_details.queries.batches import format_queries, process_query
from lm_human_preference_details.queries.registry import check_query_dataset, query_source
from lm_human_preference_details.queries.samplers import (
    ColumnSource,
    HFQuerySampler,
    QuerySampler,
    TextSource,
    make_query_sampler,
    print_first_query,
)

__all__ = ["ColumnSource", "HFQuerySampler", "QuerySampler", "TextSource", "check_query_dataset", "format_queries",
           "make_query_sampler", "print_first_query", "process_query", "query_source"]
