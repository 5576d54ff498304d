"""check_laws with settings= and the LawReport it returns."""

from hypothesis import settings

from lowering.like import programs_like
from transforms.laws import check_laws


def check_on_my_model(my_pass, ep):
    report = check_laws(
        my_pass,
        programs=programs_like(ep),
        settings=settings(max_examples=8, derandomize=True, database=None),  # repeatable
    )
    print(report)  # e.g. "6 of 8 programs changed, 1 declined"
    assert report.changed >= report.tried // 2, report  # put to the test, not just once
    return report
