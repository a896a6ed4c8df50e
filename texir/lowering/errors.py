"""Typed lowering errors: every message names the tag, backend id or nodes involved and the fix."""

from __future__ import annotations

from texir.errors import LoweringError


class PlanError(LoweringError):
    """A partition plan is invalid; raised before any backend runs."""


class UnknownNodeError(PlanError):
    """The plan tags a node the program does not have."""


class MissingDelegationSpecError(PlanError):
    """A tag is used by nodes but has no DelegationSpec."""


class TaggedPlaceholderError(PlanError, RuntimeError):
    """A user input, a nested-graph placeholder or an output node is tagged. Also a RuntimeError:
    ExecuTorch's `to_backend` raises that for it, and its callers catch that."""


class NonConvexPartitionError(PlanError):
    """A path leaves a partition and comes back (or two partitions depend on each other)."""


class DelegateClaimedError(PlanError):
    """A node of an already lowered delegate call is tagged again."""


class SharedConstantError(PlanError):
    """A parameter, buffer or constant tagged for one partition is also used by another."""


class MutationOutsidePartitionError(PlanError):
    """A consumed buffer is mutated by a value the same partition does not compute."""


class MutationAlsoOutputError(MutationOutsidePartitionError, AssertionError):
    """A consumed buffer's new value is also another output of the program (a user output, or the
    new value of a second buffer). ExecuTorch's `to_backend` refuses it (an AssertionError, which its
    callers catch): a delegate's signature returns a consumed buffer's update as that update only."""


class NoCopyConstantError(SharedConstantError, RuntimeError):
    """A constant its partitioner marked `no_copy` is also used outside its partition. Also a
    RuntimeError: ExecuTorch's `to_backend` raises that for it, and its callers catch that."""


class SubgraphAttrError(PlanError):
    """A nested-graph get_attr and the node using it are tagged differently."""


class SplitMultiOutputError(PlanError):
    """A multi-output node and a getitem of its results are in different partitions."""


class BackendError(LoweringError):
    """A backend could not be found or failed."""


class UnknownBackendError(BackendError):
    """No backend is registered under the requested id."""


class BackendRegistrationError(BackendError):
    """`register_backend` was called with an invalid id or backend, or an id already taken."""


class BackendPreprocessError(BackendError):
    """A backend's preprocess raised or returned something that is not a PreprocessResult."""


class PartitionerError(LoweringError):
    """A partitioner's options are invalid or the partitioner returned something unusable."""


class KeptOpNotDelegatedError(LoweringError):
    """An op a partitioner asked to keep whole (`ops_to_not_decompose`) was left undelegated."""


class PartitionerArgumentError(PartitionerError, TypeError):
    """`lower` was given one partitioner where a sequence goes (or `to_backend` a sequence where one goes)."""


class PlanArgumentError(PlanError, TypeError):
    """A PartitionPlan was built with a mapping where its fields take sorted pairs."""
