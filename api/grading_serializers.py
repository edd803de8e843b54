"""Serializers of the API's grading: runs and their results, grades, the course and lab reports. Read-only; command
output and exit codes are filled in for course staff only (``StaffViewSerializer``)."""

from __future__ import annotations

from rest_framework import serializers

from api.serializers import CourseSerializer, PersonSerializer, StaffViewSerializer
from grading.models import CheckResult, Grade, GradingRun


class CheckResultSerializer(StaffViewSerializer):
    """A check's outcome. Students read the feedback; command output and exit codes are for staff only."""

    check = serializers.IntegerField(source="check_ref_id", read_only=True, allow_null=True)
    feedback = serializers.CharField(source="feedback_text", read_only=True)
    exit_code = serializers.IntegerField(read_only=True, allow_null=True, help_text="Staff only.")
    stdout = serializers.CharField(read_only=True, allow_null=True, help_text="Staff only.")
    stderr = serializers.CharField(read_only=True, allow_null=True, help_text="Staff only.")

    class Meta:
        model = CheckResult
        fields = [
            "id",
            "check",
            "check_title",
            "order",
            "passed",
            "points",
            "max_points",
            "timed_out",
            "duration_ms",
            "feedback",
            "exit_code",
            "stdout",
            "stderr",
            "output_truncated",
        ]
        read_only_fields = fields

    staff_only = ("exit_code", "stdout", "stderr")

    def course_id_of(self, instance: CheckResult) -> int | None:
        return instance.run.attempt.lab.course_id


class GradingRunSerializer(StaffViewSerializer):
    lab = serializers.IntegerField(source="attempt.lab_id", read_only=True)
    student = PersonSerializer(source="attempt.student", read_only=True)
    effective_score = serializers.DecimalField(max_digits=8, decimal_places=2, read_only=True, allow_null=True)
    error = serializers.CharField(
        source="error_message", read_only=True, help_text="Why the run failed, in plain words."
    )
    error_detail = serializers.CharField(
        source="error", read_only=True, allow_null=True, help_text="Technical detail of a failure. Staff only."
    )

    class Meta:
        model = GradingRun
        fields = [
            "id",
            "attempt",
            "lab",
            "student",
            "state",
            "trigger",
            "created_at",
            "started_at",
            "finished_at",
            "score",
            "max_score",
            "late_penalty_percent",
            "effective_score",
            "error_code",
            "error",
            "error_detail",
        ]
        read_only_fields = fields

    staff_only = ("error_detail",)

    def course_id_of(self, instance: GradingRun) -> int | None:
        return instance.attempt.lab.course_id


class GradingRunDetailSerializer(GradingRunSerializer):
    results = CheckResultSerializer(many=True, read_only=True)

    class Meta(GradingRunSerializer.Meta):
        fields = [*GradingRunSerializer.Meta.fields, "results"]
        read_only_fields = fields


class GradeSerializer(serializers.ModelSerializer):
    course = serializers.IntegerField(source="lab.course_id", read_only=True)
    student = PersonSerializer(read_only=True)
    final_score = serializers.DecimalField(max_digits=8, decimal_places=2, read_only=True, allow_null=True)

    class Meta:
        model = Grade
        fields = [
            "id",
            "lab",
            "course",
            "student",
            "score",
            "max_score",
            "late",
            "override_score",
            "override_reason",
            "overridden_at",
            "final_score",
            "is_overridden",
            "updated_at",
        ]
        read_only_fields = fields


class ReportCellSerializer(serializers.Serializer):
    lab = serializers.IntegerField()
    final = serializers.DecimalField(max_digits=8, decimal_places=2, allow_null=True)
    computed = serializers.DecimalField(max_digits=8, decimal_places=2, allow_null=True)
    max_score = serializers.DecimalField(max_digits=8, decimal_places=2, allow_null=True)
    late = serializers.BooleanField()
    overridden = serializers.BooleanField()
    attempts = serializers.IntegerField()


class ReportRowSerializer(serializers.Serializer):
    student = PersonSerializer()
    cells = ReportCellSerializer(many=True)
    total = serializers.DecimalField(max_digits=10, decimal_places=2)


class ReportLabSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField()
    max_points = serializers.DecimalField(max_digits=8, decimal_places=2, allow_null=True)
    due_at = serializers.DateTimeField(allow_null=True)


class CourseReportSerializer(serializers.Serializer):
    course = CourseSerializer()
    labs = ReportLabSerializer(many=True)
    rows = ReportRowSerializer(many=True)
    max_total = serializers.DecimalField(max_digits=10, decimal_places=2)


class DistributionBucketSerializer(serializers.Serializer):
    low_percent = serializers.IntegerField()
    high_percent = serializers.IntegerField()
    count = serializers.IntegerField()


class LabReportSerializer(serializers.Serializer):
    """A lab at a glance for its staff: who is enrolled, how many are graded, and how the scores spread."""

    lab = serializers.IntegerField(source="lab.id")
    title = serializers.CharField(source="lab.title")
    max_points = serializers.DecimalField(max_digits=8, decimal_places=2)
    enrolled = serializers.IntegerField()
    graded = serializers.IntegerField()
    attempts = serializers.SerializerMethodField()
    mean_percent = serializers.FloatField(allow_null=True)
    median_percent = serializers.FloatField(allow_null=True)
    distribution = DistributionBucketSerializer(many=True)

    def get_attempts(self, report) -> int:
        return len(report.attempts)
