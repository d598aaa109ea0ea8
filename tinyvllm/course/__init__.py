"""The course: a lesson per chapter (lessons/NN-slug.md), each explaining one step of the engine at the stage where
it happens. lessons.py reads them (load_lessons, lesson_for_stage), check.py checks that what they cite and show is
still true, show.py holds the small helpers their pycon blocks call to show the project's own numbers."""
from tinyvllm.course.lessons import (CHAPTERS, Chapter, CodeRef, CourseError, Lesson, load_lesson, load_lessons,
                                     lesson_for_stage, lessons_for_stage)

__all__ = ["CHAPTERS", "Chapter", "CodeRef", "CourseError", "Lesson", "load_lesson", "load_lessons",
           "lesson_for_stage", "lessons_for_stage"]
