// Console test harness (no NUnit): named test cases, per-test PASS/FAIL lines, final "N passed, N failed".
using System;
using System.Collections.Generic;
using System.Diagnostics;
using Igi.MsgPack;

namespace Igi.Tests
{
    /// <summary>A failed assertion.</summary>
    public sealed class AssertionException : Exception
    {
        public AssertionException(string message) : base(message) { }
    }

    /// <summary>A test that cannot run here (e.g. an NUnit test's Assert.Ignore): reported as SKIP, not counted.</summary>
    public sealed class SkippedException : Exception
    {
        public SkippedException(string message) : base(message) { }
    }

    /// <summary>Assertions that throw <see cref="AssertionException"/>.</summary>
    public static class Check
    {
        public static void True(bool condition, string what)
        {
            if (!condition) throw new AssertionException("expected true: " + what);
        }

        public static void Equal<T>(T expected, T actual, string what = "")
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
                throw new AssertionException(what + ": expected <" + expected + "> got <" + actual + ">");
        }

        public static void BytesEqual(byte[] expected, byte[] actual, string what)
        {
            if (expected.Length == actual.Length)
            {
                bool same = true;
                for (int i = 0; i < expected.Length && same; i++) same = expected[i] == actual[i];
                if (same) return;
            }
            throw new AssertionException(what + ": bytes differ\n  expected " + Hex(expected) + "\n  actual   " + Hex(actual));
        }

        public static void DeepEqual(object expected, object actual, string what)
        {
            if (!MsgPackValue.DeepEquals(expected, actual))
                throw new AssertionException(what + ": expected " + MsgPackValue.ToDebugString(expected) +
                                             " got " + MsgPackValue.ToDebugString(actual));
        }

        public static T Throws<T>(Action action, string what) where T : Exception
        {
            try { action(); }
            catch (T e) { return e; }
            catch (Exception e)
            {
                throw new AssertionException(what + ": expected " + typeof(T).Name + " but got " + e.GetType().Name + ": " + e.Message);
            }
            throw new AssertionException(what + ": expected " + typeof(T).Name + " but nothing was thrown");
        }

        public static string Hex(byte[] data)
        {
            return BitConverter.ToString(data).Replace("-", "").ToLowerInvariant();
        }
    }

    /// <summary>Runs named tests and reports.</summary>
    public sealed class TestRunner
    {
        private readonly List<KeyValuePair<string, Action>> _tests = new List<KeyValuePair<string, Action>>();
        private readonly List<string> _skipped = new List<string>();

        public string Filter;

        public void Add(string name, Action test) { _tests.Add(new KeyValuePair<string, Action>(name, test)); }

        public void Skip(string group, string reason) { _skipped.Add(group + ": " + reason); }

        /// <summary>Runs every test; returns the number of failures.</summary>
        public int Run()
        {
            int passed = 0, failed = 0;
            foreach (string s in _skipped) Console.WriteLine("SKIP " + s);
            foreach (var t in _tests)
            {
                if (!string.IsNullOrEmpty(Filter) && t.Key.IndexOf(Filter, StringComparison.Ordinal) < 0) continue;
                var sw = Stopwatch.StartNew();
                try
                {
                    t.Value();
                    passed++;
                    Console.WriteLine("PASS " + t.Key + " (" + sw.ElapsedMilliseconds + " ms)");
                }
                catch (SkippedException e)
                {
                    Console.WriteLine("SKIP " + t.Key + ": " + e.Message);
                }
                catch (Exception e)
                {
                    failed++;
                    var inner = e is System.Reflection.TargetInvocationException && e.InnerException != null ? e.InnerException : e;
                    Console.WriteLine("FAIL " + t.Key + ": " + inner.GetType().Name + ": " + inner.Message);
                    if (!(inner is AssertionException)) Console.WriteLine(inner.StackTrace);
                }
                Console.Out.Flush();
            }
            Console.WriteLine(passed + " passed, " + failed + " failed");
            return failed;
        }
    }
}
