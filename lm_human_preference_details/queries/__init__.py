"""Query data (FIDELITY A1-A5, E9 per-rank seeds): from a `--task.query-dataset` value to batches of queries, one module per
job.

Down the floors, each entered once: the value becomes a `QuerySource` (`registry.query_source`, the one place that
decides what a name or path is; its checks run before the run starts), `samplers.make_query_sampler` opens it through
the source's own module, each rank draws from its stream (`streams`), and `batches` processes and batches the queries.

    source.py     what a source is: `QuerySource` and its two kinds, `ColumnSource` and `TextSource`
    registry.py   the names and file types --task.query-dataset takes; `query_source`, `check_query_dataset`
    hub.py        the Hub's parquet export (bookcorpus) and local parquet files
    tldr17.py     webis/tldr-17's corpus archive, read as its loading script read it
    oai2019.py    OpenAI's 2019 sources: books-2019, tldr-2019, cnndm, the queries of label files
    text_files.py local .jsonl/.txt query files
    columns.py    a memory-mapped text column and its row-count checks
    streams.py    per-rank streams: seeded shuffles, the shard rule, a rank's window of rows
    batches.py    query processing (A4 query processing), formatting (A5 query formatting), the sampler interface and its
    checks
    samplers.py   the baseline's and the 2019 pipeline's samplers, `make_query_sampler`, resumable batches
"""

from lm_human_preference_details.queries.batches import format_queries, process_query
from lm_human_preference_details.queries.registry import check_query_dataset, query_source
from lm_human_preference_details.queries.samplers import HFQuerySampler, QuerySampler, make_query_sampler, print_first_query

__all__ = ["HFQuerySampler", "QuerySampler", "check_query_dataset", "format_queries", "make_query_sampler",
           "print_first_query", "process_query", "query_source"]
