"""withdrawn: an approval's new outcome, the requester's WITHDRAW (issue 26)

No column changes: `approvals.status` is a string that takes the new value as it is. Before
this, the approvals API's DELETE was recorded as a denial by the request's own requester
with the reason "withdrawn by the caller" (no approver can deny their own request, so only
a DELETE wrote that); those rows become what they were, withdrawn. Their audit rows stay
as written (the trail is append-only). Downgrading turns every withdrawn request back into
such a denial, which the code before this reads.

Revision ID: 0021
Revises: 0020
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CALLER = "withdrawn by the caller"  # gateway/requests.py's reason, before this revision


def upgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE approvals SET status = 'withdrawn', reason = NULL "
            "WHERE status = 'denied' AND decided_by = requester AND reason = :caller"
        ).bindparams(caller=CALLER)
    )


def downgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE approvals SET status = 'denied', reason = :caller WHERE status = 'withdrawn'"
        ).bindparams(caller=CALLER)
    )
