"""A results page regenerated from rows keeps the reading written under it by hand
(`evaluation.shared.summary.write_page_keeping_reading`, used by the benchmark scripts' `report`)."""

from hf_posext.evaluation.shared.summary import READING, write_page_keeping_reading


def test_the_table_is_replaced_and_the_reading_kept(tmp_path):
    page = tmp_path / "page.md"
    write_page_keeping_reading(page, ["# T", "| a |", ""])
    assert page.read_text() == f"# T\n| a |\n{READING}\n\n(to be written from the rows above)\n"
    page.write_text(page.read_text().replace("(to be written from the rows above)", "Measured: a beats b."))
    write_page_keeping_reading(page, ["# T", "| a | b |", ""])
    assert page.read_text() == f"# T\n| a | b |\n{READING}\n\nMeasured: a beats b.\n"
