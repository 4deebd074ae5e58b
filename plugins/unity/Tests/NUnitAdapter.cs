// Runs the Unity Test Framework (NUnit) tests of Tests/Runtime in the console runner: every [Test] method of every
// [TestFixture] class becomes a test named "nunit:<Fixture>.<Method>", with [SetUp]/[TearDown] around it. Compiled
// against Debian's NUnit framework (mono-devel brings libnunit-cil-dev); Unity's own Test Runner runs the same classes.
using System;
using System.Reflection;

namespace Igi.Tests
{
    public static class NUnitAdapter
    {
        public static void Register(TestRunner runner, Assembly assembly)
        {
            foreach (Type type in assembly.GetTypes())
            {
                if (!type.IsDefined(typeof(NUnit.Framework.TestFixtureAttribute), false)) continue;
                MethodInfo setUp = Find(type, typeof(NUnit.Framework.SetUpAttribute));
                MethodInfo tearDown = Find(type, typeof(NUnit.Framework.TearDownAttribute));
                foreach (MethodInfo m in type.GetMethods(BindingFlags.Public | BindingFlags.Instance))
                {
                    if (!m.IsDefined(typeof(NUnit.Framework.TestAttribute), false)) continue;
                    MethodInfo test = m;
                    runner.Add("nunit:" + type.Name + "." + m.Name, () => RunOne(type, setUp, test, tearDown));
                }
            }
        }

        private static MethodInfo Find(Type type, Type attribute)
        {
            foreach (MethodInfo m in type.GetMethods(BindingFlags.Public | BindingFlags.Instance))
                if (m.IsDefined(attribute, false)) return m;
            return null;
        }

        private static void RunOne(Type type, MethodInfo setUp, MethodInfo test, MethodInfo tearDown)
        {
            object fixture = Activator.CreateInstance(type);
            try
            {
                if (setUp != null) Invoke(setUp, fixture);
                Invoke(test, fixture);
            }
            finally
            {
                if (tearDown != null) Invoke(tearDown, fixture);
            }
        }

        private static void Invoke(MethodInfo method, object fixture)
        {
            try { method.Invoke(fixture, null); }
            catch (TargetInvocationException e)
            {
                Exception inner = e.InnerException ?? e;
                if (inner is NUnit.Framework.IgnoreException) throw new SkippedException(inner.Message);
                if (inner is NUnit.Framework.AssertionException) throw new AssertionException(inner.Message.Trim());
                throw new TargetInvocationException(inner);
            }
        }
    }
}
